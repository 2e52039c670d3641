"""Replay a workflow trace as real concurrent requests against the bundled SGLang server, per policy.

    .venv/bin/python benchmarks/live_replay.py                       # CPU: about 6 minutes
    .venv/bin/python benchmarks/live_replay.py --gpu --model-size medium --workflows 64 --token-scale 1

Each workflow of the trace is a coroutine that sends its requests in order,
at the trace's (scaled) send times but never before its previous request
finished, through `/generate` with token ids made from the segments (the same
content id always gives the same ids), tagged with the workflow, the agent and
the fixed-prompt boundary; end events go to the control route at their time.
Every policy gets a fresh server and exactly the same requests. The model's
own output replaces the trace's outputs, so output reuse (`output_id`) does
not carry over: prompts are reused, generated text is not.

Writes docs/live-replay.md and docs/live-replay.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")

from agentcache.server_ext.launcher import ServeOptions, Server, ensure_model  # noqa: E402
from agentcache.trace import End, Request, Trace, read_trace  # noqa: E402
from agentcache.workloads import GenConfig, generate  # noqa: E402

DOCS = Path(__file__).resolve().parents[1] / "docs"


@dataclass
class Sent:
    latency_s: float
    prompt_tokens: int
    cached_tokens: int


class TokenMaker:
    """Deterministic token ids per content id, scaled in length, inside the model's vocabulary."""

    def __init__(self, vocab_size: int, scale: float):
        self.low, self.high = 10, max(11, vocab_size - 10)
        self.scale = scale
        self._cache: dict[str, list[int]] = {}

    def segment(self, content_id: str, tokens: int) -> list[int]:
        ids = self._cache.get(content_id)
        if ids is None:
            rng = random.Random(content_id)
            n = max(1, round(tokens * self.scale))
            ids = self._cache[content_id] = [rng.randrange(self.low, self.high) for _ in range(n)]
        return ids

    def prompt(self, request: Request) -> tuple[list[int], int]:
        ids: list[int] = []
        fixed = 0
        for i, seg in enumerate(request.segments):
            ids += self.segment(seg.content_id, seg.tokens)
            if i + 1 == request.fixed:
                fixed = len(ids)
        return ids, fixed


def subset(trace: Trace, workflows: int) -> Trace:
    keep: list[str] = []
    for e in trace.events:
        if isinstance(e, Request) and e.workflow not in keep:
            keep.append(e.workflow)
            if len(keep) == workflows:
                break
    chosen = set(keep)
    return Trace(trace.meta, [e for e in trace.events if e.workflow in chosen])


async def replay_live(
    base_url: str, trace: Trace, tokens: TokenMaker, time_scale: float, max_new_tokens: int
) -> list[Sent]:
    sent: list[Sent] = []
    by_workflow: dict[str, list] = {}
    for e in trace.events:
        by_workflow.setdefault(e.workflow, []).append(e)
    start = time.monotonic()

    async def run(client: httpx.AsyncClient, events: list) -> None:
        for e in events:
            delay = e.ts * time_scale - (time.monotonic() - start)
            if delay > 0:
                await asyncio.sleep(delay)
            if isinstance(e, End):
                (await client.post(f"{base_url}/agentcache/v1/workflows/{e.workflow}/end")).raise_for_status()
                continue
            ids, fixed = tokens.prompt(e)
            tags = {"v": 1, "workflow": e.workflow, "agent": e.agent, "agent_name": e.agent, "fixed_tokens": fixed}
            body = {
                "input_ids": ids,
                "sampling_params": {
                    "max_new_tokens": min(e.output, max_new_tokens),
                    "temperature": 0,
                    "custom_params": {"agentcache": tags},
                },
            }
            t0 = time.perf_counter()
            r = await client.post(f"{base_url}/generate", json=body)
            r.raise_for_status()
            meta = r.json()["meta_info"]
            sent.append(Sent(time.perf_counter() - t0, meta["prompt_tokens"], meta.get("cached_tokens", 0)))

    async with httpx.AsyncClient(timeout=600) as client:
        await asyncio.gather(*(run(client, events) for events in by_workflow.values()))
    return sent


def summarize(sent: list[Sent]) -> dict[str, float | int]:
    lat = sorted(s.latency_s for s in sent)
    prompt = sum(s.prompt_tokens for s in sent)
    cached = sum(s.cached_tokens for s in sent)
    return {
        "requests": len(sent),
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "hit_rate": cached / prompt if prompt else 0.0,
        "mean_latency_s": statistics.fmean(lat),
        "p90_latency_s": lat[min(len(lat) - 1, int(0.9 * len(lat)))],
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trace", help="trace file (default: a generated code-retry trace)")
    p.add_argument("--family", default="code-retry", help="generated family when no --trace (default %(default)s)")
    p.add_argument("--workflows", type=int, default=16)
    p.add_argument("--policies", default="lru,pbkv")
    p.add_argument("--capacity", type=int, default=12000, help="server KV tokens (default %(default)s)")
    p.add_argument("--token-scale", type=float, default=0.35, help="scale segment sizes (CPU prefill is slow)")
    p.add_argument("--time-scale", type=float, default=0.25, help="scale send times")
    p.add_argument("--max-new-tokens", type=int, default=4)
    p.add_argument("--model-size", default="small")
    p.add_argument("--gpu", action="store_true", help="GPU mode (default: CPU dev mode without a GPU)")
    p.add_argument("--port", type=int, default=30100)
    p.add_argument("--out", default=str(DOCS / "live-replay"), help="output path without extension")
    p.add_argument("--log-dir", default=str(DOCS.parent / "out"), help="where the servers' logs go")
    args = p.parse_args()

    trace = (
        read_trace(args.trace)
        if args.trace
        else generate(args.family, GenConfig(workflows=max(args.workflows, 1), seed=7))
    )
    trace = subset(trace, args.workflows)
    model = ensure_model(None, args.model_size)
    vocab = json.loads((Path(model) / "config.json").read_text())["vocab_size"]
    results = {}
    for policy in [x.strip() for x in args.policies.split(",") if x.strip()]:
        opts = ServeOptions(
            model_path=model,
            policy=policy,
            port=args.port,
            max_total_tokens=args.capacity,
            cpu=not args.gpu,
            log_path=str(Path(args.log_dir) / f"live-replay-{policy}.log"),
        )
        print(f"{policy}: starting the server", file=sys.stderr)
        with Server(opts) as server:
            started = time.monotonic()
            sent = asyncio.run(
                replay_live(
                    server.base_url, trace, TokenMaker(vocab, args.token_scale), args.time_scale, args.max_new_tokens
                )
            )
            results[policy] = {**summarize(sent), "wall_s": time.monotonic() - started}
            results[policy]["server_stats"] = {
                k: v for k, v in httpx.get(f"{server.base_url}/agentcache/v1/stats").json().items() if k != "workflows"
            }
        print(
            f"{policy}: {results[policy]['hit_rate']:.1%} hit, mean {results[policy]['mean_latency_s']:.2f} s",
            file=sys.stderr,
        )

    command = "python benchmarks/live_replay.py " + " ".join(sys.argv[1:])
    lines = [
        "# Live replay: a generated trace as real concurrent requests against the SGLang server",
        "",
        f"Command: `{command.strip()}` ({platform.machine()}, {'GPU' if args.gpu else 'CPU dev mode'}, {args.model_size} random-weight model).",
        f"{args.workflows} workflows of `{trace.meta.name}`, KV capacity {args.capacity} tokens, segment sizes x{args.token_scale}, send times x{args.time_scale}.",
        "",
        "| policy | requests | hit rate | cached tokens | mean latency (s) | p90 latency (s) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for policy, r in results.items():
        lines.append(
            f"| {policy} | {r['requests']} | {r['hit_rate']:.1%} | {r['cached_tokens']:,} | {r['mean_latency_s']:.2f} | {r['p90_latency_s']:.2f} |"
        )
    if "lru" in results:
        for policy, r in results.items():
            if policy != "lru":
                lines.append(
                    f"\n{policy} vs lru: {r['hit_rate'] / max(results['lru']['hit_rate'], 1e-9):.2f}x the hit rate, "
                    f"{results['lru']['mean_latency_s'] / r['mean_latency_s']:.2f}x lower mean latency."
                )
    Path(f"{args.out}.md").write_text("\n".join(lines) + "\n")
    Path(f"{args.out}.json").write_text(json.dumps(results, indent=1))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
