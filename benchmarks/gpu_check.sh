#!/usr/bin/env bash
# The live lru-vs-pbkv comparison on a GPU, with a larger random-weight model (about 8 minutes).
#
#   bash scripts/setup.sh --gpu && bash benchmarks/gpu_check.sh
#
# Prepared for when a GPU machine is available; writes docs/live-replay-gpu.{md,json}
# (or under $OUT when set). It exercises the real CUDA kernels: prefill, decode,
# the radix cache and the plugin, with cache hits large enough to show in latency.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-docs}
nvidia-smi -L
timeout 480 .venv/bin/python benchmarks/live_replay.py --gpu --model-size large \
    --workflows 48 --token-scale 1.0 --time-scale 0.05 --capacity 40000 --max-new-tokens 16 \
    --out "$OUT/live-replay-gpu"
