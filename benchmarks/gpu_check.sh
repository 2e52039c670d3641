#!/usr/bin/env bash
# The GPU checks, prepared for when a GPU machine is available (about 8 minutes on one GPU).
#
#   bash scripts/setup.sh --gpu && bash benchmarks/gpu_check.sh
#
# 1. Prefetch with SGLang's real host-tier transfer kernels: a node loaded back from host
#    memory ahead of its request serves that request from device memory, with the same
#    output as when computed from scratch (tests/test_prefetch_e2e.py, in GPU mode).
# 2. The live benchmark (`agentcache bench`: fresh server per run, warm-up, alternating order,
#    medians with min-max) with a random-weight model large enough that prefill dominates:
#    pbkv against lru and SGLang's lfu/slru, written to $OUT/live-bench-gpu.{json,png}.
# Where SGLang cannot be installed (a GPU machine that reaches no package registry),
# `python3 benchmarks/gpu_anchor.py` times the served model's arithmetic with PyTorch alone
# (docs/results/gpu-anchor.md).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-docs/results}
nvidia-smi -L
timeout 180 .venv/bin/python -m pytest -q tests/test_prefetch_e2e.py
timeout 400 .venv/bin/agentcache bench --gpu --model-size large --workflows 48 --token-scale 1.0 \
    --time-scale 0.05 --max-new-tokens 16 --repeat 3 --plot "$OUT/live-bench-gpu.png" --json \
    | tail -n 1 >"$OUT/live-bench-gpu.json"
