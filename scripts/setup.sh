#!/usr/bin/env bash
# Install agentcache and everything its demo and tests need into .venv/ at the repo root.
#
#   bash scripts/setup.sh          # CPU-only machine (no NVIDIA GPU): SGLang CPU-style
#   bash scripts/setup.sh --gpu    # NVIDIA GPU: SGLang with its own CUDA dependency set
#
# CPU-style means: CPU torch 2.13.0, SGLang 0.5.23 without its CUDA-pinned
# dependencies plus the CPU-capable subset of them, a stub `sgl_kernel`
# (server_ext/shims), and PyPI's torchvision made importable beside CPU torch.
# A plain `pip install sglang` would pull a multi-GB CUDA stack instead.
# Re-running is safe: pip skips what is already there.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV="$ROOT/.venv"
MODE=cpu
if [ "${1:-}" = "--gpu" ]; then
    MODE=gpu
elif [ -z "${1:-}" ] && command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    MODE=gpu
fi

PYTHON=${PYTHON:-}
if [ -z "$PYTHON" ]; then
    # The CPU torch wheel is built for Python 3.11.
    for candidate in python3.11 python3; do
        if command -v "$candidate" >/dev/null 2>&1; then PYTHON=$candidate; break; fi
    done
fi
"$PYTHON" -c 'import sys; sys.exit(0 if sys.version_info[:2] >= (3, 11) else 1)' ||
    { echo "setup: Python >= 3.11 is required (found $("$PYTHON" --version 2>&1))" >&2; exit 1; }

step() { printf '\n==> %s\n' "$*"; }

if [ ! -x "$VENV/bin/python" ]; then
    step "creating $VENV"
    "$PYTHON" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)
"${PIP[@]}" install -q -U pip

if [ "$MODE" = gpu ]; then
    step "installing agentcache with SGLang 0.5.23 and every extra (GPU)"
    "${PIP[@]}" install -q -e "$ROOT[all]"
else
    CONSTRAINTS="$ROOT/scripts/cpu-constraints.txt"
    step "installing CPU torch 2.13.0"
    "${PIP[@]}" install -q torch==2.13.0
    step "installing SGLang 0.5.23 without its CUDA-pinned dependencies"
    "${PIP[@]}" install -q --no-deps sglang==0.5.23
    step "installing SGLang's CPU-capable dependencies"
    "${PIP[@]}" install -q -c "$CONSTRAINTS" \
        -r "$ROOT/scripts/sglang-cpu-deps.txt" triton==3.8.0 torchvision==0.28.0 dill
    # A second resolution: crewai's dependencies want an older protobuf and a newer
    # openai than SGLang's pins. Resolving both sets at once backtracks for many
    # minutes; one after the other settles at once, and the server runs with the
    # result (checked by the end-to-end tests).
    step "installing agentcache with the command's and the framework extras"
    "${PIP[@]}" install -q -c "$CONSTRAINTS" -e "$ROOT[cli,langgraph,autogen,crewai,predictor,compiled,dev]" \
        "prometheus-client>=0.20" sglang-router==0.3.2
    step "making torchvision importable beside CPU torch"
    "$VENV/bin/python" "$ROOT/scripts/patch_torchvision.py"
    step "putting the sgl_kernel stub on the path"
    SITE=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    # Appended to sys.path, so a real sgl_kernel, if one is ever installed, still wins.
    echo "$ROOT/server_ext/shims" >"$SITE/agentcache_sgl_kernel_stub.pth"
fi

step "compiling the policy core to C (mypyc; it runs on SGLang's scheduler thread)"
"$VENV/bin/python" -m agentcache.build_compiled ||
    echo "setup: WARNING: the policy core could not be compiled (a C compiler and Python's headers are needed):" \
        "it runs from its Python source, the same policy at a higher cost per request" >&2

step "checking the install"
SGLANG_USE_CPU_ENGINE=$([ "$MODE" = cpu ] && echo 1 || echo 0) "$VENV/bin/python" - <<'EOF'
import importlib.metadata as md
import sglang, torch
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache  # noqa: F401
import agentcache.server_ext.cache  # noqa: F401
from agentcache import compiled
print(f"torch {torch.__version__} | sglang {sglang.__version__} | agentcache {md.version('agentcache')}"
      f" | policy core {compiled.active()}")
EOF
echo "setup: done ($MODE). Run: .venv/bin/agentcache --help"
