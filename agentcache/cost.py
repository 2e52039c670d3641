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
heads x 128, bf16) on one H100 SXM, derived from first principles, not
measured here (no GPU on the build machine):

- LINEAR: 2 x 8e9 FLOP per token at 50% of 989 TFLOP/s dense bf16 = 3.2e-5 s.
- ATTN: 4 x 32 layers x 4096 FLOP per token per context token (QK^T and AV)
  at the same 495 TFLOP/s = 1.06e-9 s.
- DECODE: a decode step reads the 16 GB of weights at 3.35 TB/s (4.8 ms, about
  6 ms with overheads) and is shared by the whole batch; at a batch of 32
  concurrent requests a generated token costs 6e-3 / 32 = 1.9e-4 s of GPU time.
- RELOAD: 2 x 32 x 8 x 128 x 2 bytes = 131 kB of KV per token over PCIe at an
  effective 25 GB/s = 5.2e-6 s (PBKV's testbed had 20 GB/s).

- STEP: one forward pass reads the weights once, whatever the batch: 16 GB at
  3.35 TB/s is 4.8 ms, about 6 ms with overheads; a decode step costs that
  plus KV_READ per token of context the batch attends to (131 kB per token at
  3.35 TB/s = 3.9e-8 s), and a prefill batch costs at least that.

So reloading a token costs about a sixth of recomputing it, and a long
context makes recompute dearer still. The ratios, not the absolute seconds,
are what comparisons between policies rest on. The timed replay
(agentcache/replay/serving.py) uses the step costs; docs/serving-model.md sets
them beside published measurements.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CostModel:
    linear_s: float = 3.2e-5  # prefill, per new token
    attn_s: float = 1.06e-9  # prefill, per new token per token of context before it
    decode_s: float = 1.9e-4  # per generated token (a 6 ms step shared by a batch of 32)
    reload_s: float = 5.2e-6  # host -> device copy, per token
    step_s: float = 6e-3  # one forward pass: the weights read once
    kv_read_s: float = 3.9e-8  # a decode step, per token of context read

    def prefill_s(self, new_tokens: int, context: int) -> float:
        # sum_{i=0}^{new-1} (context + i) = new*context + new*(new-1)/2
        attended = new_tokens * context + new_tokens * (new_tokens - 1) / 2
        return new_tokens * self.linear_s + attended * self.attn_s

    def prefill_batch_s(self, new_and_context: list[tuple[int, int]]) -> float:
        """One prefill batch: its requests' compute, or one pass over the weights when that is more."""
        return max(self.step_s, sum(self.prefill_s(new, context) for new, context in new_and_context))

    def decode_step_s(self, batch: int, context_tokens: int) -> float:
        """One decode step of `batch` requests reading `context_tokens` tokens of KV in all."""
        return self.step_s + self.kv_read_s * context_tokens if batch else 0.0

    def request_s(self, prompt: int, device_hit: int, host_hit: int, output: int) -> float:
        cached = device_hit + host_hit
        return self.prefill_s(prompt - cached, cached) + host_hit * self.reload_s + output * self.decode_s

    def miss_cost_per_token(self, depth: int, tokens: int, on_host: bool) -> float:
        """Seconds per token to get a node of `tokens` tokens ending at `depth` back after eviction."""
        if on_host:
            return self.reload_s
        return self.linear_s + self.attn_s * max(0.0, depth - tokens / 2)


DEFAULT_COST = CostModel()
