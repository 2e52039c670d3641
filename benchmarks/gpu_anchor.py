"""The cost model's constants measured on a GPU: an 8B Llama-shaped model in bf16, timed with PyTorch.

    python3 benchmarks/gpu_anchor.py                     # on a CUDA machine, about 2 minutes: docs/results/
    python3 benchmarks/gpu_anchor.py --render docs/results/gpu-anchor.json   # the page again from its figures
    .venv/bin/python benchmarks/gpu_anchor.py --tiny --out /tmp/x   # the same code, toy shape (a check, no figures)

agentcache/cost.py is fitted to published measurements of Llama-3-8B on one H100
(docs/results/serving-model.md). SGLang's GPU build could not be installed on the GPU machine
this ran on (it reaches no package registry), so this times the model's arithmetic instead: Llama-3-8B's shape (32
layers, d_model 4096, 32 query and 8 KV heads of 128, MLP 14,336, vocabulary 128,256)
with random bf16 weights (no weights can be downloaded; the work per token is the
same), PyTorch's scaled_dot_product_attention (FlashAttention-2 on CUDA), a KV cache
per layer, and decode steps replayed as CUDA graphs as SGLang runs them. It measures:

- prefill of a fresh prompt, one request, 1,000 to 100,000 tokens;
- what a cache hit saves: `new` tokens prefilled on top of `cached` tokens already in
  the KV cache, against the same prompt prefilled fresh (what the policies trade in);
- batched prefill (16 prompts of 512 tokens: SGLang's 8,192-token prefill budget), and a
  batch of 16 requests that each extend 4,000 cached tokens by 250, against the same fresh;
- decode steps at the batch sizes and contexts of docs/results/serving-model.md;
- a host-to-device copy of KV from pinned memory (what HiCache's prefetch moves),
  per token of KV, against recomputing that token.

Each figure is a median of timed repetitions after a warm-up, with min-max, beside
what agentcache/cost.py gives for the same work. What it leaves out: SGLang's own
kernels (FlashInfer/FA3, fused norms and rotary), its scheduler, paged KV, and
tensor-parallel setups.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from pages import RESULTS, render_again, save, template  # noqa: E402

from agentcache.cost import DEFAULT_COST  # noqa: E402


@dataclass(frozen=True)
class Shape:
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int

    @property
    def kv_bytes_per_token(self) -> int:  # K and V of every layer, bf16
        return self.layers * 2 * self.kv_heads * self.head_dim * 2


LLAMA3_8B = Shape(layers=32, hidden=4096, heads=32, kv_heads=8, head_dim=128, intermediate=14336, vocab=128256)
TOY = Shape(layers=2, hidden=64, heads=4, kv_heads=2, head_dim=16, intermediate=128, vocab=97)


@dataclass(frozen=True)
class Plan:
    """What to time; the toy plan is the GPU plan scaled down, so the CPU check runs every path."""

    fresh: tuple[int, ...]  # prompt tokens, one request, nothing cached
    hits: tuple[tuple[int, int], ...]  # (cached, new): new tokens prefilled on top of cached ones
    batched: tuple[int, int]  # (prompts, tokens each)
    batched_hit: tuple[int, int, int]  # (prompts, cached tokens each, new tokens each)
    decode: tuple[tuple[int, int], ...]  # (running requests, context tokens each)
    copy_tokens: int  # tokens of KV copied host -> device
    reps: int


GPU_PLAN = Plan(
    fresh=(1_000, 4_000, 10_000, 20_000, 50_000, 100_000),
    hits=((2_000, 200), (4_000, 500), (16_000, 1_000), (32_000, 2_000), (64_000, 2_000)),
    batched=(16, 512),
    batched_hit=(16, 4_000, 250),
    decode=((1, 1_000), (1, 32_000), (40, 400), (128, 192), (256, 350), (64, 4_000)),
    copy_tokens=8_192,
    reps=5,
)
LONG_PROMPT = 50_000  # prompts this long and longer are timed LONG_PROMPT_REPS times (seconds each)
LONG_PROMPT_REPS = 2
DECODE_REPS = 20  # a captured decode step takes milliseconds: more repetitions

TOY_PLAN = Plan(
    fresh=(10, 40),
    hits=((20, 4), (40, 8)),
    batched=(4, 8),
    batched_hit=(3, 12, 4),
    decode=((1, 10), (4, 6)),
    copy_tokens=64,
    reps=2,
)


class Llama:
    """Llama-3's forward pass over a contiguous KV cache: enough to time prefill, extend and decode."""

    def __init__(self, shape: Shape, device: torch.device, dtype: torch.dtype, seed: int = 0):
        self.shape, self.device, self.dtype = shape, device, dtype
        gen = torch.Generator(device=device).manual_seed(seed)

        def weight(rows: int, cols: int) -> torch.Tensor:
            return torch.randn(rows, cols, device=device, dtype=dtype, generator=gen) / math.sqrt(rows)

        s = shape
        self.embed = torch.randn(s.vocab, s.hidden, device=device, dtype=dtype, generator=gen)
        self.layers = [
            {
                "attn_norm": torch.ones(s.hidden, device=device, dtype=dtype),
                "qkv": weight(s.hidden, (s.heads + 2 * s.kv_heads) * s.head_dim),
                "o": weight(s.heads * s.head_dim, s.hidden),
                "mlp_norm": torch.ones(s.hidden, device=device, dtype=dtype),
                "gate_up": weight(s.hidden, 2 * s.intermediate),
                "down": weight(s.intermediate, s.hidden),
            }
            for _ in range(s.layers)
        ]
        self.norm = torch.ones(s.hidden, device=device, dtype=dtype)
        self.lm_head = weight(s.hidden, s.vocab)
        half = s.head_dim // 2
        self.inv_freq = 1.0 / (500_000.0 ** (torch.arange(half, device=device, dtype=torch.float32) / half))

    def new_cache(self, batch: int, tokens: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer (K, V) of [batch, kv_heads, tokens, head_dim], filled with random values
        so that a context counted as cached is there to be read."""
        s = self.shape
        dims = (batch, s.kv_heads, tokens, s.head_dim)
        return [
            (
                torch.randn(dims, device=self.device, dtype=self.dtype),
                torch.randn(dims, device=self.device, dtype=self.dtype),
            )
            for _ in range(s.layers)
        ]

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)

    def forward(self, tokens: torch.Tensor, cache: list[tuple[torch.Tensor, torch.Tensor]], start: int) -> torch.Tensor:
        """Logits of each sequence's last position; `tokens` [batch, n] sit at positions start..start+n-1,
        and every earlier position is read from `cache`, where this call writes its own K and V."""
        s = self.shape
        batch, n = tokens.shape
        end = start + n
        angles = torch.arange(start, end, device=self.device, dtype=torch.float32)[:, None] * self.inv_freq
        cos, sin = (f(angles).to(self.dtype)[:, None, :] for f in (torch.cos, torch.sin))
        # A query sees every cached position and the new ones up to its own (aligned lower right).
        mask = causal_lower_right(n, end) if n > 1 else None
        x = self.embed[tokens]
        for layer, (k_cache, v_cache) in zip(self.layers, cache):
            h = F.rms_norm(x, (s.hidden,), layer["attn_norm"])
            q, k, v = (h @ layer["qkv"]).split(
                (s.heads * s.head_dim, s.kv_heads * s.head_dim, s.kv_heads * s.head_dim), dim=-1
            )
            q = self._rotate(q.view(batch, n, s.heads, s.head_dim), cos, sin)
            k = self._rotate(k.view(batch, n, s.kv_heads, s.head_dim), cos, sin)
            k_cache[:, :, start:end] = k.transpose(1, 2)
            v_cache[:, :, start:end] = v.view(batch, n, s.kv_heads, s.head_dim).transpose(1, 2)
            attended = F.scaled_dot_product_attention(
                q.transpose(1, 2), k_cache[:, :, :end], v_cache[:, :, :end], attn_mask=mask, enable_gqa=True
            )
            x = x + attended.transpose(1, 2).reshape(batch, n, s.heads * s.head_dim) @ layer["o"]
            h = F.rms_norm(x, (s.hidden,), layer["mlp_norm"])
            gate, up = (h @ layer["gate_up"]).chunk(2, dim=-1)
            x = x + (F.silu(gate) * up) @ layer["down"]
        return F.rms_norm(x[:, -1], (s.hidden,), self.norm) @ self.lm_head


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _timed(fn: Callable[[], object], device: torch.device, reps: int) -> dict:
    """Median and min-max seconds of `reps` calls after one warm-up call."""
    fn()
    _sync(device)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return {"median_s": statistics.median(times), "min_s": min(times), "max_s": max(times), "reps": reps}


def _prompt(model: Llama, batch: int, n: int) -> torch.Tensor:
    return torch.randint(0, model.shape.vocab, (batch, n), device=model.device)


def _single_prompts(model: Llama, plan: Plan, progress: Callable[[str], None]) -> tuple[list, list]:
    """Fresh prefill of one prompt at each size, and each hit's extend beside its whole prompt fresh."""
    sizes = {*plan.fresh, *(cached + new for cached, new in plan.hits)}
    cache = model.new_cache(1, max(sizes))
    prompts = {n: _prompt(model, 1, n) for n in sizes}
    fresh = {}
    for n in sorted(prompts):
        progress(f"fresh prefill, {n:,} tokens")
        fresh[n] = _timed(
            lambda n=n: model.forward(prompts[n], cache, 0),
            model.device,
            plan.reps if n < LONG_PROMPT else LONG_PROMPT_REPS,
        )
    hits = []
    for cached, new in plan.hits:
        progress(f"{new:,} new tokens on {cached:,} cached")
        tail = prompts[cached + new][:, cached:]
        extend = _timed(lambda tail=tail, cached=cached: model.forward(tail, cache, cached), model.device, plan.reps)
        hits.append({"cached": cached, "new": new, "extend": extend, "fresh": fresh[cached + new]})
    return [{"tokens": n, **fresh[n]} for n in plan.fresh], hits


def _batched(model: Llama, plan: Plan, progress: Callable[[str], None]) -> tuple[dict, dict]:
    prompts_n, tokens_each = plan.batched
    progress(f"batched prefill, {prompts_n} x {tokens_each} tokens")
    cache = model.new_cache(prompts_n, tokens_each)
    prompt = _prompt(model, prompts_n, tokens_each)
    batched = {
        "prompts": prompts_n,
        "tokens_each": tokens_each,
        **_timed(lambda: model.forward(prompt, cache, 0), model.device, plan.reps),
    }
    prompts_n, cached, new = plan.batched_hit
    progress(f"batched prefill, {prompts_n} x ({cached:,} cached + {new:,} new) tokens")
    cache = model.new_cache(prompts_n, cached + new)
    prompt = _prompt(model, prompts_n, cached + new)
    batched_hit = {
        "prompts": prompts_n,
        "cached": cached,
        "new": new,
        "fresh": _timed(lambda: model.forward(prompt, cache, 0), model.device, plan.reps),
        "extend": _timed(lambda: model.forward(prompt[:, cached:], cache, cached), model.device, plan.reps),
    }
    return batched, batched_hit


def _decode_step(model: Llama, running: int, context: int, reps: int) -> dict:
    cache = model.new_cache(running, context + 1)
    tokens = _prompt(model, running, 1)

    def step() -> torch.Tensor:
        return model.forward(tokens, cache, context)

    if model.device.type != "cuda":
        return _timed(step, model.device, reps)
    # As SGLang runs decode: one captured graph per batch size, replayed.
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    return _timed(graph.replay, model.device, DECODE_REPS)


def measure(model: Llama, plan: Plan, progress: Callable[[str], None]) -> dict:
    with torch.inference_mode():
        fresh, hits = _single_prompts(model, plan, progress)
        batched, batched_hit = _batched(model, plan, progress)
        decode = []
        for running, context in plan.decode:
            progress(f"decode step, {running} running x {context:,} context")
            decode.append({"running": running, "context": context, **_decode_step(model, running, context, plan.reps)})

    progress(f"host-to-device copy, KV of {plan.copy_tokens:,} tokens")
    on_gpu = model.device.type == "cuda"
    nbytes = plan.copy_tokens * model.shape.kv_bytes_per_token
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=on_gpu)
    on_device = torch.empty(nbytes, dtype=torch.uint8, device=model.device)
    copy = _timed(lambda: on_device.copy_(host, non_blocking=True), model.device, plan.reps)
    return {
        "fresh": fresh,
        "hits": hits,
        "batched": batched,
        "batched_hit": batched_hit,
        "decode": decode,
        "copy": {"tokens": plan.copy_tokens, "bytes": nbytes, "pinned": on_gpu, **copy},
    }


def self_check(model: Llama) -> float:
    """The largest difference between the last logits of a prompt prefilled fresh and of the same
    prompt prefilled in three parts over the cache (a prefix, an extend, a decode step)."""
    with torch.inference_mode():
        prompt = _prompt(model, 2, 24)
        fresh = model.forward(prompt, model.new_cache(2, 24), 0)
        cache = model.new_cache(2, 24)
        model.forward(prompt[:, :15], cache, 0)
        model.forward(prompt[:, 15:23], cache, 15)
        stepped = model.forward(prompt[:, 23:], cache, 23)
    return (fresh.float() - stepped.float()).abs().max().item() / fresh.float().abs().max().item()


def _ms(t: dict) -> str:
    return f"{t['median_s'] * 1e3:,.1f} [{t['min_s'] * 1e3:,.1f}-{t['max_s'] * 1e3:,.1f}]"


def render(figures: dict) -> str:
    cost = DEFAULT_COST
    r = figures["results"]
    lines = [
        "# The cost model beside a GPU",
        "",
        *template(
            "gpu-anchor/intro.md",
            command=figures["command"],
            device=figures["device"],
            torch=figures["torch"],
            date=figures["date"],
            reps=figures["plan"]["reps"],
            long_prompt_reps=LONG_PROMPT_REPS,
            long_prompt=f"{LONG_PROMPT:,}",
            decode_reps=DECODE_REPS,
            self_check=f"{figures['self_check']:.1e}",
        ),
        "",
        "## Prefill of a fresh prompt (one request)",
        "",
        "| prompt tokens | measured (ms) | model (ms) | measured tokens/s |",
        "|---:|---:|---:|---:|",
    ]
    for f in r["fresh"]:
        n = f["tokens"]
        lines.append(f"| {n:,} | {_ms(f)} | {cost.prefill_s(n, 0) * 1e3:,.1f} | {n / f['median_s']:,.0f} |")
    b = r["batched"]
    total = b["prompts"] * b["tokens_each"]
    modelled = cost.prefill_batch_s([(b["tokens_each"], 0)] * b["prompts"])
    lines += [
        "",
        f"Batched prefill, {b['prompts']} prompts of {b['tokens_each']} tokens: {_ms(b)} ms, "
        f"{total / b['median_s']:,.0f} tokens/s (model {total / modelled:,.0f}).",
        "",
        "## What a cache hit saves",
        "",
        "`new` tokens prefilled on top of `cached` tokens already in the KV cache, against the whole",
        "prompt prefilled fresh: the time to first token a policy's hit buys.",
        "",
        "| cached + new tokens | fresh (ms) | on the cache (ms) | saved | model: fresh / on the cache (ms) | model saved |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for h in r["hits"]:
        cached, new = h["cached"], h["new"]
        fresh, extend = h["fresh"]["median_s"], h["extend"]["median_s"]
        m_fresh, m_extend = cost.prefill_s(cached + new, 0), cost.prefill_s(new, cached)
        lines.append(
            f"| {cached:,} + {new:,} | {_ms(h['fresh'])} | {_ms(h['extend'])} | {1 - extend / fresh:.0%} "
            f"| {m_fresh * 1e3:,.1f} / {m_extend * 1e3:,.1f} | {1 - m_extend / m_fresh:.0%} |"
        )
    bh = r["batched_hit"]
    prompts_n, cached, new = bh["prompts"], bh["cached"], bh["new"]
    fresh, extend = bh["fresh"]["median_s"], bh["extend"]["median_s"]
    m_fresh = cost.prefill_batch_s([(cached + new, 0)] * prompts_n)
    m_extend = cost.prefill_batch_s([(new, cached)] * prompts_n)
    lines += [
        "",
        f"One prefill batch of {prompts_n} requests, each {cached:,} cached + {new:,} new tokens (agents' calls",
        f"on a cached fixed prompt and history): fresh {_ms(bh['fresh'])} ms, on the cache {_ms(bh['extend'])} ms,",
        f"{1 - extend / fresh:.0%} saved (model {m_fresh * 1e3:,.1f} / {m_extend * 1e3:,.1f} ms, {1 - m_extend / m_fresh:.0%}).",
        "",
        "## Decode steps (CUDA graphs)",
        "",
        "| running requests | context tokens each | measured step (ms) | model (ms) |",
        "|---:|---:|---:|---:|",
    ]
    for d in r["decode"]:
        model_ms = cost.decode_step_s(d["running"], d["running"] * d["context"]) * 1e3
        lines.append(f"| {d['running']} | {d['context']:,} | {_ms(d)} | {model_ms:.2f} |")
    c = r["copy"]
    per_token = c["median_s"] / c["tokens"]
    recompute = next((f["median_s"] / f["tokens"] for f in r["fresh"] if f["tokens"] >= 4_000), None)
    lines += [
        "",
        "## Loading KV back from host memory",
        "",
        f"KV of {c['tokens']:,} tokens ({c['bytes'] / 1e9:.2f} GB, {c['bytes'] // c['tokens']:,} bytes a token) copied "
        f"from {'pinned ' if c['pinned'] else ''}host memory in one transfer: {_ms(c)} ms, "
        f"{c['bytes'] / c['median_s'] / 1e9:.1f} GB/s, {per_token * 1e6:.2f} us a token "
        f"(model `reload_s` {cost.reload_s * 1e6:.2f} us, derived from an assumed 25 GB/s).",
    ]
    if recompute:
        lines.append(
            f"Recomputing a token in a fresh prompt of 4,000 tokens costs {recompute * 1e6:.1f} us: "
            f"a reload is {per_token / recompute:.2f} of a recompute (model {cost.reload_s / cost.linear_s:.2f})."
        )
    lines += [
        "HiCache moves pages layer by layer, which can be slower than one bulk copy: this is the best case.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder for gpu-anchor.json and .md")
    parser.add_argument("--tiny", action="store_true", help="a toy shape on the CPU: checks the code, no figures")
    parser.add_argument("--render", type=Path, help="write the page again from this gpu-anchor.json")
    args = parser.parse_args(argv)
    if args.render:
        render_again(args.render.stem, render, folder=args.render.parent)
        return
    on_gpu = torch.cuda.is_available()
    if not (on_gpu or args.tiny):
        raise SystemExit("gpu_anchor.py times a GPU and none is visible; --tiny runs the check on CPU")
    device = torch.device("cuda" if on_gpu else "cpu")
    # bf16 on a GPU (its kernels, the toy shape too); float32 on CPU, where the check is exact.
    dtype = torch.bfloat16 if on_gpu else torch.float32
    shape, plan = (TOY, TOY_PLAN) if args.tiny else (LLAMA3_8B, GPU_PLAN)
    model = Llama(shape, device, dtype)
    check = self_check(model)
    if dtype == torch.float32 and check > 1e-4:
        raise SystemExit(f"self-check failed: fresh and cached prefill differ by {check:.3g} (relative)")

    def progress(what: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {what}", flush=True)

    results = measure(model, plan, progress)
    figures = {
        "device": (torch.cuda.get_device_name() if on_gpu else "CPU")
        + (" (toy shape: no figures)" if args.tiny else ""),
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d"),
        "shape": asdict(shape),
        "plan": asdict(plan),
        "self_check": check,
        "results": results,
    }
    save("gpu-anchor", render, figures, folder=args.out)


if __name__ == "__main__":
    main()
