"""Soak and adversarial load: bounded memory over 10k workflows, and never worse than LRU under hostile tags.

    .venv/bin/python benchmarks/soak.py        # about 10 minutes on 2 cores

1. Soak: 10,000 workflows (a fifth of them never ended) replayed through
   SGLang's cache with pbkv; the process's resident memory and the policy's
   state (active workflows, tagged nodes, predictor contexts) are sampled as
   the workflows pass, to show they stay bounded.
2. Adversarial tags, pbkv against LRU on the same requests: every request a new
   workflow that never ends; every request claiming one single workflow; and
   agent ids that change with every request.

Writes docs/results/reliability.md and docs/results/reliability.json.
"""

from __future__ import annotations

import argparse
import resource
import time
from dataclasses import replace

from pages import save_section, template
from rich.console import Console
from suite import mean_prompt

from agentcache.policy import WorkflowRegistry, tags_of
from agentcache.policy.nodes import MAX_TRACKED_AGENTS, MAX_WORKFLOWS_PER_NODE
from agentcache.policy.pbkv.demand import MAX_FORECAST_WORKFLOWS
from agentcache.policy.pbkv.timing import MAX_GAP_MODELS, PER_AGENT_GAPS
from agentcache.predictor import MarkovPredictor
from agentcache.replay.runner import PreparedTrace, replay_policy
from agentcache.trace import End, Request, Trace
from agentcache.workloads import GenConfig, generate

SOAK_WORKFLOWS = 10_000
SAMPLES = 10
ADVERSARIAL_WORKFLOWS = 60


def rss_mb() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * resource.getpagesize() / 2**20


def soak(console: Console) -> list[dict]:
    trace = generate("code-retry", GenConfig(workflows=SOAK_WORKFLOWS, rate=2.0, unended=0.2, seed=11))
    baseline_mb = rss_mb()
    prepared = PreparedTrace(trace)
    prepared_mb = rss_mb()
    capacity = int(mean_prompt(trace) * 8)
    samples: list[dict] = []
    every = len(prepared.requests) // SAMPLES
    seen = {"n": 0, "started": time.perf_counter()}
    holder: dict = {}

    import agentcache.replay.runner as runner

    original = runner.ReplayCache

    class Sampled(original):  # noqa: D401 - a ReplayCache that samples memory as requests pass
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            holder["cache"] = self

    runner.ReplayCache = Sampled
    try:

        def sample() -> None:
            seen["n"] += 1
            if seen["n"] % every:
                return
            cache = holder["cache"]
            policy = cache.policy
            tagged = workflows_on_nodes = 0
            stack = list(cache.cache.tree_core.root_node.children.values())
            while stack:
                node = stack.pop()
                stack.extend(node.children.values())
                t = tags_of(node)
                if t is not None:
                    tagged += 1
                    workflows_on_nodes += len(t.workflows)
            samples.append(
                {
                    "requests": seen["n"],
                    "rss_mb": round(rss_mb(), 1),
                    "active_workflows": len(policy.registry),
                    "retired_workflows": policy.registry.retired_count,
                    "tagged_nodes": tagged,
                    "workflow_entries_on_nodes": workflows_on_nodes,
                    "predictor_contexts": len(policy.predictor.inner.counts),
                    "forecasts_kept": len(policy.forecasts.values),
                    "elapsed_s": round(time.perf_counter() - seen["started"], 1),
                }
            )
            console.print(samples[-1])

        result = replay_policy(prepared, "pbkv", capacity, lease_s=60.0, on_request=sample)
    finally:
        runner.ReplayCache = original
    return [
        {
            "capacity": capacity,
            "requests": result.requests,
            "hit_rate": result.hit_rate,
            "rss_mb_before_trace": round(baseline_mb, 1),
            "rss_mb_trace_prepared": round(prepared_mb, 1),
            "samples": samples,
        }
    ]


def adversarial(console: Console) -> list[dict]:
    base = generate("group-chat", GenConfig(workflows=ADVERSARIAL_WORKFLOWS, seed=5))
    requests = [e for e in base.events if isinstance(e, Request)]
    variants = {
        "honest tags": base,
        "every request a new workflow, never ended": Trace(
            base.meta, [replace(r, workflow=f"new-{i}") for i, r in enumerate(requests)]
        ),
        "every request one single workflow": Trace(base.meta, [replace(r, workflow="one") for r in requests]),
        "agent id changes every request": Trace(
            base.meta, [replace(r, agent=f"{r.agent}-{i}") for i, r in enumerate(requests)]
        ),
    }
    rows = []
    for name, trace in variants.items():
        trace = Trace(trace.meta, [e for e in trace.events if not isinstance(e, End) or name == "honest tags"])
        prepared = PreparedTrace(trace)
        capacity = int(mean_prompt(trace) * 6)
        by = {p: replay_policy(prepared, p, capacity) for p in ("lru", "pbkv")}
        rows.append(
            {
                "load": name,
                "capacity": capacity,
                **{p: r.hit_rate for p, r in by.items()},
                **{f"{p}_ms_per_request": 1000 * r.replay_wall_s / max(r.requests, 1) for p, r in by.items()},
            }
        )
        console.print(rows[-1])
    return rows


def bounds_section() -> list[str]:
    """The limits on the policy's state and work, read from the code that enforces them."""
    from agentcache.server_ext.cache import MAX_PENDING_REQUESTS, PREDICTOR_BUDGET_MS
    from agentcache.server_ext.config import DEFAULT_LEASE_S
    from agentcache.server_ext.intake import RenderedPrefixes
    from agentcache.server_ext.records import MAX_AGENTS_PER_RECORD, MAX_RECORD_BYTES, MAX_RECORDS, MAX_TENANTS

    prefixes = RenderedPrefixes()

    registry, markov = WorkflowRegistry(), MarkovPredictor()
    return [
        *template(
            "reliability/bounds.md",
            max_active=f"{registry.max_active:,}",
            max_path=registry.max_path,
            lease_s=f"{DEFAULT_LEASE_S:.0f}",
            max_workflows_per_node=MAX_WORKFLOWS_PER_NODE,
            max_forecast_workflows=f"{MAX_FORECAST_WORKFLOWS:,}",
            max_agents=markov.max_agents,
            max_contexts=f"{markov.max_contexts:,}",
            max_states=markov.MAX_STATES,
            max_gap_models=f"{MAX_GAP_MODELS:,}",
            per_agent_gaps=PER_AGENT_GAPS,
            max_tracked_agents=f"{MAX_TRACKED_AGENTS:,}",
            predictor_budget_ms=f"{PREDICTOR_BUDGET_MS:.0f}",
            max_prefixes=f"{prefixes.max_entries:,}",
            max_prefix_tokens=f"{prefixes.max_tokens:,}",
            max_prefix_tokens_each=f"{prefixes.max_tokens_each:,}",
            max_pending_requests=f"{MAX_PENDING_REQUESTS:,}",
            max_records=f"{MAX_RECORDS:,}",
            max_record_mb=MAX_RECORD_BYTES >> 20,
            max_agents_per_record=MAX_AGENTS_PER_RECORD,
            max_tenants=f"{MAX_TENANTS:,}",
        ),
        "",
    ]


def main() -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    console = Console(stderr=True)
    soaked = soak(console)
    hostile = adversarial(console)
    s = soaked[0]
    lines = [
        f"## Soak: {SOAK_WORKFLOWS:,} code-retry workflows, a fifth never ended (lease 60 s), pbkv, capacity {s['capacity']} tokens",
        "",
        f"{s['requests']:,} requests, hit rate {s['hit_rate']:.1%}. Resident memory was {s['rss_mb_before_trace']:,.0f} MB"
        f" with SGLang imported and the trace generated, and {s['rss_mb_trace_prepared']:,.0f} MB once the replay had"
        " built every request's token ids (all of them stay in memory for the run); what the replay adds beyond that"
        f" is the cache and the policy's state. Sampled every {s['requests'] // SAMPLES:,} requests:",
        "",
        "| requests | RSS (MB) | active workflows | retired so far | tagged nodes | workflow entries on nodes | predictor contexts | forecasts kept |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for x in s["samples"]:
        lines.append(
            f"| {x['requests']:,} | {x['rss_mb']} | {x['active_workflows']} | {x['retired_workflows']:,} | {x['tagged_nodes']} "
            f"| {x['workflow_entries_on_nodes']} | {x['predictor_contexts']} | {x['forecasts_kept']} |"
        )
    lines += [
        "",
        f"## Adversarial tags (group-chat, {ADVERSARIAL_WORKFLOWS} workflows' requests; capacity 6x the mean prompt)",
        "",
        "Replay wall time per request covers SGLang's cache operations and, for pbkv, the policy's work",
        "(forecasts, eviction keys), on one core.",
        "",
        "| load | lru hit rate | pbkv hit rate | pbkv - lru | lru ms / request | pbkv ms / request |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in hostile:
        lines.append(
            f"| {r['load']} | {r['lru']:.1%} | {r['pbkv']:.1%} | {(r['pbkv'] - r['lru']) * 100:+.1f} pts "
            f"| {r['lru_ms_per_request']:.1f} | {r['pbkv_ms_per_request']:.1f} |"
        )
    lines += [
        "",
        "The policy never pins anything: it only orders eviction among the nodes SGLang itself may evict, so",
        "the share of KV memory it holds back from eviction is zero, and admission (free + evictable slots) is",
        "exactly SGLang's. Hostile tags can only make it rank nodes badly, which the table bounds.",
        "",
        *bounds_section(),
    ]
    save_section("reliability", "soak", lines, {"soak": soaked, "adversarial": hostile})


if __name__ == "__main__":
    main()
