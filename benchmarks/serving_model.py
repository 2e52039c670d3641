"""The serving model beside the published measurements it is anchored on.

    .venv/bin/python benchmarks/serving_model.py        # a few seconds

The timed replay (agentcache/replay/serving.py) turns the cost model
(agentcache/cost.py: an 8B model, bf16, on one H100 SXM) into step times, time
to first token and throughput. This sets the model's figures beside published
measurements of Llama-3(.1)-8B on one H100 for the same settings, and beside our
own timing of that model's shape on an H200 (docs/results/gpu-anchor.json, written by
benchmarks/gpu_anchor.py on a GPU machine), so a reader can see where the model is
close and where it is not. Writes docs/results/serving-model.md.
"""

from __future__ import annotations

import argparse
import json
import statistics

from pages import RESULTS, save, template

from agentcache.cost import DEFAULT_COST
from agentcache.replay.runner import PreparedTrace
from agentcache.replay.serving import serve_trace
from agentcache.trace import End, Meta, Request, Segment, Trace

# (setting, published value, source); every value is the source's, none measured here.
PREFILL_ANCHORS = [
    (10_000, 0.264, "vLLM blog 2026-01-08, KV offloading connector, Fig. 1 (read off the figure, +-15 ms)"),
    (20_000, 0.634, "same"),
    (50_000, 2.290, "same"),
    (100_000, 6.844, "same"),
]
BATCHED_PREFILL_TOK_S = (43_800, "10,000 x 512-token prompts; vLLM blog 2026-01-08, Fig. 2 (SGLang PR #2134: 43,925)")
DECODE_ANCHORS = [  # (batch, context tokens per request, published step ms, source)
    (1, 1_000, 6.48, "vLLM blog 2026-04-22 (FP8 KV cache): ITL = 6.44 + 4.37e-5 x context ms, batch 1"),
    (1, 32_000, 7.84, "same fit"),
    (40, 400, 7.95, "LambdaLabsML/vllm-benchmark prompt_40 (ShareGPT), 7.9-8.0 ms per step"),
    (128, 192, 10.0, "SGLang PR #2134: bench_one_batch, 128 in / 128 out, median 10.0 ms"),
    (256, 350, 13.0, "LambdaLabsML/vllm-benchmark prompt_320: 12.5-13.5 ms per step at 256"),
]
BURST = (320, 202, 179, 29.5, 1.731, "LambdaLabsML/vllm-benchmark prompt_320: 320 ShareGPT prompts at once")


def burst_trace(requests: int, prompt: int, output: int) -> Trace:
    """`requests` prompts sent at once, nothing shared (as a random benchmark sends them)."""
    events: list = []
    for i in range(requests):
        events.append(Request(0.0, f"b{i}", "user", (Segment(f"prompt-{i}", prompt),), 0, output))
        events.append(End(0.0, f"b{i}"))
    return Trace(Meta(name="burst"), events)


def main() -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    cost = DEFAULT_COST
    gpu = json.loads((RESULTS / "gpu-anchor.json").read_text())
    ours_fresh = {f["tokens"]: f["median_s"] for f in gpu["results"]["fresh"]}
    ours_step = {(d["running"], d["context"]): d["median_s"] for d in gpu["results"]["decode"]}
    ours_batched = gpu["results"]["batched"]
    lines = [
        "# The serving model beside published measurements and a GPU",
        "",
        *template(
            "serving-model/intro.md",
            device=gpu["device"],
            date=gpu["date"],
        ),
        "",
        "## Prefill",
        "",
        "| prompt tokens (one request, nothing cached) | published TTFT (s) | ours (s) | model (s) | source |",
        "|---:|---:|---:|---:|---|",
    ]
    for tokens, published, source in PREFILL_ANCHORS:
        ours = ours_fresh[tokens]
        lines.append(f"| {tokens:,} | {published:.3f} | {ours:.3f} | {cost.prefill_s(tokens, 0):.3f} | {source} |")
    tok_s, source = BATCHED_PREFILL_TOK_S
    modelled = 512 / cost.prefill_s(512, 0)
    ours_tok_s = ours_batched["prompts"] * ours_batched["tokens_each"] / ours_batched["median_s"]
    lines += [
        "",
        f"Batched prefill of 512-token prompts: published {tok_s:,} tokens/s, ours {ours_tok_s:,.0f} tokens/s"
        f" ({ours_batched['prompts']} at once), model {modelled:,.0f} tokens/s ({source}).",
        "",
        "## Decode steps",
        "",
        "| running requests | context tokens each | published step (ms) | ours (ms) | model (ms) | source |",
        "|---:|---:|---:|---:|---:|---|",
    ]
    for batch, context, published, source in DECODE_ANCHORS:
        step = cost.decode_step_s(batch, batch * context) * 1e3
        ours = ours_step[(batch, context)] * 1e3
        lines.append(f"| {batch} | {context:,} | {published:.2f} | {ours:.2f} | {step:.2f} | {source} |")
    requests, prompt, output, published_rps, published_ttft, source = BURST
    result = serve_trace(PreparedTrace(burst_trace(requests, prompt, output)), "lru", 10_000_000, max_running=256)
    served = [s for s in result.served if s.admitted]
    span = max(s.finished for s in served)
    lines += [
        "",
        "## Under load",
        "",
        f"{requests} requests sent at once, {prompt} prompt and {output} output tokens each (the published run used",
        "ShareGPT prompts of those mean lengths), at most 256 running:",
        "",
        "| figure | published | model |",
        "|---|---:|---:|",
        f"| throughput (requests/s) | {published_rps} | {requests / span:.1f} |",
        f"| median time to first token (s) | {published_ttft} | {statistics.median(s.ttft_s for s in served):.2f} |",
        "",
        f"Source: {source}.",
        "",
        *template("serving-model/limits.md"),
        "",
    ]
    save("serving-model", lambda _: "\n".join(lines))


if __name__ == "__main__":
    main()
