"""benchmarks/gpu_anchor.py: the model it times computes what a cached prefill must (its committed page is its
figures: tests/test_benchmark_pages.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import gpu_anchor  # noqa: E402


def test_prefill_over_the_cache_gives_the_fresh_logits():
    """A prompt prefilled in three parts over the KV cache (prefix, extend, decode step) must end in the
    logits of the same prompt prefilled fresh; a misaligned causal mask or rotary offset breaks it."""
    model = gpu_anchor.Llama(gpu_anchor.TOY, torch.device("cpu"), torch.float32)
    assert gpu_anchor.self_check(model) < 1e-5


def test_cached_positions_are_read():
    """The extend must attend to the cached positions, not only to its own tokens."""
    model = gpu_anchor.Llama(gpu_anchor.TOY, torch.device("cpu"), torch.float32)
    prompt = torch.randint(0, gpu_anchor.TOY.vocab, (1, 12))
    with torch.inference_mode():
        cache = model.new_cache(1, 12)
        model.forward(prompt[:, :8], cache, 0)
        stepped = model.forward(prompt[:, 8:], cache, 8)
        cache[0][0][:, :, :8] = 0.0  # drop the first layer's cached keys
        changed = model.forward(prompt[:, 8:], cache, 8)
    assert not torch.allclose(stepped, changed)


def test_toy_run_writes_figures_and_page(tmp_path):
    gpu_anchor.main(["--tiny", "--out", str(tmp_path)])
    figures = json.loads((tmp_path / "gpu-anchor.json").read_text())
    results = figures["results"]
    plan = gpu_anchor.TOY_PLAN
    assert [f["tokens"] for f in results["fresh"]] == list(plan.fresh)
    assert [(h["cached"], h["new"]) for h in results["hits"]] == list(plan.hits)
    assert [(d["running"], d["context"]) for d in results["decode"]] == list(plan.decode)
    assert all(f["min_s"] <= f["median_s"] <= f["max_s"] for f in results["fresh"])
    assert results["copy"]["bytes"] == plan.copy_tokens * gpu_anchor.TOY.kv_bytes_per_token
    page = (tmp_path / "gpu-anchor.md").read_text()
    assert "toy shape: no figures" in page and "## What a cache hit saves" in page
