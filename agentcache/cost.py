"""The cost model: what serving a request costs, and what a cache miss costs; every constant in one place.

A request's modelled GPU time (its share of the server's GPU time; a sum of
costs, not a latency) is

    prefill(new, ctx) + reload(host_hit) + decode(output)
    prefill(new, ctx) = new * LINEAR + ATTN * sum_{i=0}^{new-1} (ctx + i)
    reload(n)         = n * RELOAD
    decode(n)         = n * DECODE

where `new` are the prompt tokens not served from device or host cache, `ctx`
the tokens before them (served from cache), and `host_hit` the tokens loaded
back from host memory (HiCache) instead of being recomputed.

Default constants: a Llama-3-8B-class model (32 layers, d_model 4096, 8 KV
heads x 128, bf16) on one H100 SXM, anchored on published measurements of
that model on that GPU (docs/results/serving-model.md lists them with their sources):

- LINEAR: 2.3e-5 s per prefilled token: batched prefill of 512-token prompts runs
  at about 43,800 tokens/s (vLLM, 2026; SGLang bench_one_batch, 2024, agrees).
- ATTN: 9.0e-10 s per new token per token of context before it: the quadratic
  term of single-request TTFT from 10K to 100K tokens (TTFT ~ 4.5e-7 ms x L^2).
- STEP: 6.44 ms, one forward pass (the weights read once): the intercept of
  batch-1 inter-token latency against context length.
- KV_READ: 4.37e-8 s per token of context a decode step reads (that fit's slope;
  131 kB of KV per token).
- SEQ: 1.5e-5 s per running request per decode step: what steps of 128-256
  requests take beyond the two terms above (10 ms at 128, 12.5-13.5 ms at 256).
- DECODE: a generated token's share of GPU time in a batch of 32 concurrent
  requests, (STEP + 32 SEQ) / 32 = 2.2e-4 s.
- RELOAD: 131 kB of KV per token over PCIe at an effective 25 GB/s = 5.2e-6 s
  (PBKV's testbed had 20 GB/s). Derived, and conservative: one bulk copy from pinned
  memory on an H200 moved 55 GB/s, 2.4e-6 s a token (docs/results/gpu-anchor.md), where HiCache
  moves pages.

So reloading a token costs about a fifth of recomputing it, and a long
context makes recompute dearer still. The ratios, not the absolute seconds,
are what comparisons between policies rest on. The timed replay
(agentcache/replay/serving.py) uses the step costs.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CostModel:
    linear_s: float = 2.3e-5  # prefill, per new token
    attn_s: float = 9.0e-10  # prefill, per new token per token of context before it
    decode_s: float = 2.2e-4  # per generated token (its share of a step of a batch of 32)
    reload_s: float = 5.2e-6  # host -> device copy, per token
    step_s: float = 6.44e-3  # one forward pass: the weights read once
    kv_read_s: float = 4.37e-8  # a decode step, per token of context read
    seq_s: float = 1.5e-5  # a decode step, per running request

    def prefill_s(self, new_tokens: int, context: int) -> float:
        # sum_{i=0}^{new-1} (context + i) = new*context + new*(new-1)/2
        attended = new_tokens * context + new_tokens * (new_tokens - 1) / 2
        return new_tokens * self.linear_s + attended * self.attn_s

    def prefill_batch_s(self, new_and_context: list[tuple[int, int]]) -> float:
        """One prefill batch: its requests' compute, or one pass over the weights when that is more."""
        return max(self.step_s, sum(self.prefill_s(new, context) for new, context in new_and_context))

    def decode_step_s(self, batch: int, context_tokens: int) -> float:
        """One decode step of `batch` requests reading `context_tokens` tokens of KV in all."""
        return self.step_s + self.seq_s * batch + self.kv_read_s * context_tokens if batch else 0.0

    def request_s(self, prompt: int, device_hit: int, host_hit: int, output: int) -> float:
        cached = device_hit + host_hit
        return self.prefill_s(prompt - cached, cached) + host_hit * self.reload_s + output * self.decode_s

    def miss_cost_per_token(self, depth: int, tokens: int, on_host: bool) -> float:
        """Seconds per token to get a node of `tokens` tokens ending at `depth` back after eviction."""
        if on_host:
            return self.reload_s
        return self.linear_s + self.attn_s * max(0.0, depth - tokens / 2)


DEFAULT_COST = CostModel()
