"""The ladder's verdicts on seeds nobody tuned on: every generated family, three fresh seeds, three capacities.

    .venv/bin/python benchmarks/heldout.py           # about 10 minutes on 2 cores

The suite's figures come from one seed per family, the one used while the policies were built. This
replays the same families generated with seeds 11, 22 and 33 (never used in development), at 4x, 8x
and 16x each trace's mean prompt, with lru, every SGLang built-in, pbkv and the offline reference, and
reports per point pbkv's margin over the best built-in and the share of the LRU-to-offline-reference
gap it closes. Writes docs/heldout.md and docs/heldout.json.
"""

from __future__ import annotations

import argparse
import json
import statistics

from ladder import BUILTINS, replay_point
from rich.console import Console
from rich.progress import Progress
from suite import CAPACITY_FACTORS, DOCS, GENERATED, generated

from agentcache.predictor import PredictorSpec
from agentcache.predictor.base import DEFAULT_HORIZON
from agentcache.replay.runner import PreparedTrace, fill_gap_closed, replay_policy
from agentcache.workloads import DYNAMIC_FAMILIES, FAMILIES

SEEDS = (11, 22, 33)
POLICIES = ["lru", "pbkv", "belady", *BUILTINS]


def run(families: list[str]) -> list[dict]:
    rows = []
    with Progress(console=Console(stderr=True)) as progress:
        task = progress.add_task("held-out seeds", total=len(families) * len(SEEDS) * len(CAPACITY_FACTORS))
        for family in families:
            for seed in SEEDS:
                generated_trace = generated(family, seed)
                prepared = PreparedTrace(generated_trace.trace)
                for capacity in generated_trace.capacities:
                    results, best = replay_point(prepared, capacity, POLICIES)
                    hit = {p: r.hit_rate for p, r in results.items()}
                    oracle = PredictorSpec.parse("oracle").build(trace=generated_trace.trace)
                    perfect = replay_policy(prepared, "pbkv", capacity, predictor=oracle)
                    fill_gap_closed([results["lru"], results["belady"], perfect])
                    rows.append(
                        {
                            "family": family,
                            "seed": seed,
                            "capacity": capacity,
                            "hit_rate": hit,
                            "best_builtin": best,
                            "margin": hit["pbkv"] - hit[best],
                            "gap_closed": results["pbkv"].gap_closed,
                            "perfect_forecasts": perfect.hit_rate,
                            "perfect_forecasts_gap_closed": perfect.gap_closed,
                        }
                    )
                    progress.advance(task)
    return rows


def write_docs(rows: list[dict], command: str) -> None:
    lines = [
        "# Held-out seeds: the ladder on workloads nobody tuned on",
        "",
        f"Command: `{command}`. Every generated family at seeds {', '.join(map(str, SEEDS))} (the suite",
        f"uses seed {GENERATED.seed}; these were never used while building the policies), {GENERATED.workflows} workflows,",
        "capacities 4x / 8x / 16x the trace's mean prompt, replayed through SGLang's radix cache. `margin`:",
        "pbkv minus the best of SGLang's built-ins (lfu, slru, tlru, priority, fifo, mru, filo) at that point;",
        "`gap closed`: pbkv's share of the LRU-to-offline-reference gap (the reference is a heuristic over",
        "radix nodes, so an online policy can exceed it). `perfect forecasts`: pbkv told each workflow's real",
        f"next {DEFAULT_HORIZON} agents, its forecast horizon (`--predictor oracle`, read from the trace), the rest",
        "unchanged: what is left between that and the reference is not a matter of forecasting the next",
        f"{DEFAULT_HORIZON} agents. Past the horizon a perfect forecast says nothing, where a smoothed online one keeps",
        "a little value for every agent it has seen, so where a workflow reads an agent's cache again more than",
        f"{DEFAULT_HORIZON} calls later, perfect forecasts can lose to the online ones.",
        "",
        "| family | points | pbkv >= best built-in | worst margin (pts) | median margin (pts) "
        "| gap closed >= 80% (dynamic families) | lowest gap closed | with perfect forecasts: >= 80% (dynamic) "
        "| lowest |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for family in dict.fromkeys(r["family"] for r in rows):
        mine = [r for r in rows if r["family"] == family]
        margins = [r["margin"] * 100 for r in mine]
        closed = [r["gap_closed"] for r in mine if r["gap_closed"] is not None]
        enough = f"{sum(c >= 0.8 for c in closed)} of {len(closed)}" if family in DYNAMIC_FAMILIES else "n/a"
        lowest = f"{min(closed):.0%}" if closed else "n/a"
        perfect = [r["perfect_forecasts_gap_closed"] for r in mine if r["perfect_forecasts_gap_closed"] is not None]
        perfect_enough = f"{sum(c >= 0.8 for c in perfect)} of {len(perfect)}" if family in DYNAMIC_FAMILIES else "n/a"
        perfect_lowest = f"{min(perfect):.0%}" if perfect else "n/a"
        lines.append(
            f"| {family} | {len(mine)} | {sum(m >= -1e-9 for m in margins)} | {min(margins):+.2f} "
            f"| {statistics.median(margins):+.2f} | {enough} | {lowest} | {perfect_enough} | {perfect_lowest} |"
        )
    lines += [
        "",
        "Every point:",
        "",
        "| family | seed | capacity | lru | best built-in | pbkv | offline reference | margin (pts) | gap closed "
        "| pbkv, perfect forecasts | gap closed |",
        "|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        hit = r["hit_rate"]
        closed = "" if r["gap_closed"] is None else f"{r['gap_closed']:.0%}"
        perfect = r["perfect_forecasts_gap_closed"]
        perfect_closed = "" if perfect is None else f"{perfect:.0%}"
        lines.append(
            f"| {r['family']} | {r['seed']} | {r['capacity']:,} | {hit['lru']:.1%} | {r['best_builtin']} "
            f"{hit[r['best_builtin']]:.1%} | {hit['pbkv']:.1%} | {hit['belady']:.1%} | {r['margin'] * 100:+.2f} | {closed} "
            f"| {r['perfect_forecasts']:.1%} | {perfect_closed} |"
        )
    (DOCS / "heldout.md").write_text("\n".join(lines) + "\n")
    (DOCS / "heldout.json").write_text(json.dumps(rows, indent=1) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="comma-separated families (default: all)")
    args = parser.parse_args()
    families = args.only.split(",") if args.only else list(FAMILIES)
    rows = run(families)
    command = ".venv/bin/python benchmarks/heldout.py" + (f" --only {args.only}" if args.only else "")
    write_docs(rows, command)
    Console(stderr=True).print("wrote docs/heldout.md, docs/heldout.json")


if __name__ == "__main__":
    main()
