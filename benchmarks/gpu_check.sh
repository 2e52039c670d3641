#!/usr/bin/env bash
# The GPU checks, prepared for when a GPU machine is available (about 8 minutes on one GPU).
#
#   bash scripts/setup.sh --gpu && bash benchmarks/gpu_check.sh
#
# 1. Prefetch with SGLang's real host-tier transfer kernels: a node loaded back from host
#    memory ahead of its request serves that request from device memory, with the same
#    output as when computed from scratch (tests/test_prefetch_e2e.py, in GPU mode).
# 2. The live lru-vs-pbkv comparison with a larger random-weight model, where cache hits
#    are large enough to show in latency: docs/live-replay-gpu.{md,json} (or under $OUT).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-docs}
nvidia-smi -L
timeout 180 .venv/bin/python -m pytest -q tests/test_prefetch_e2e.py
timeout 300 .venv/bin/python benchmarks/live_replay.py --gpu --model-size large \
    --workflows 48 --token-scale 1.0 --time-scale 0.05 --capacity 40000 --max-new-tokens 16 \
    --out "$OUT/live-replay-gpu"
