"""The ladder's verdicts on seeds nobody tuned on: every generated family, three fresh seeds, three capacities.

    .venv/bin/python benchmarks/heldout.py           # about 10 minutes on 2 cores

The suite's figures come from one seed per family, the one used while the policies were built. This
replays the same families generated with seeds 11, 22 and 33 (never used in development), at 4x, 8x
and 16x each trace's mean prompt, with lru, every SGLang built-in, pbkv and the offline reference, and
reports per point pbkv's margin over the best built-in and the share of the LRU-to-offline-reference
gap it closes; beside it pbkv with a forecaster trained beforehand on the same family, with perfect
forecasts, and with perfect forecasts and reads. Writes docs/results/heldout.md and docs/results/heldout.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import replace

from ladder import replay_point
from pages import RESULTS
from rich.console import Console
from rich.progress import Progress
from suite import CAPACITY_FACTORS, GENERATED, generated

from agentcache.policy.pbkv import default_forecaster
from agentcache.policy.spec import BUILTINS
from agentcache.predictor import PredictorSpec
from agentcache.predictor.base import DEFAULT_HORIZON
from agentcache.predictor.training import warm_up
from agentcache.replay.runner import PreparedTrace, fill_gap_closed, replay_policy
from agentcache.workloads import DYNAMIC_FAMILIES, FAMILIES, generate

COMMAND = ".venv/bin/python benchmarks/heldout.py"
SEEDS = (11, 22, 33)
POLICIES = ["lru", "pbkv", "belady", *BUILTINS]
# What pbkv's own forecaster knows after a long run of the same app: it first observes this many workflows of the
# family (another seed), then serves the held-out trace as usual. Where that barely moves pbkv, what is left is
# not learning too slowly but what the agents called so far cannot tell.
TRAINING = replace(GENERATED, seed=101, workflows=3000)


def run(families: list[str]) -> list[dict]:
    rows = []
    with Progress(console=Console(stderr=True)) as progress:
        task = progress.add_task("held-out seeds", total=len(families) * len(SEEDS) * len(CAPACITY_FACTORS))
        for family in families:
            training = generate(family, TRAINING)
            for seed in SEEDS:
                generated_trace = generated(family, seed)
                prepared = PreparedTrace(generated_trace.trace)
                for capacity in generated_trace.capacities:
                    results, best = replay_point(prepared, capacity, POLICIES)
                    hit = {p: r.hit_rate for p, r in results.items()}
                    oracle = PredictorSpec.parse("oracle").build(trace=generated_trace.trace)
                    perfect = replay_policy(prepared, "pbkv", capacity, predictor=oracle)
                    fill_gap_closed([results["lru"], results["belady"], perfect])
                    told = replay_policy(
                        prepared,
                        "pbkv",
                        capacity,
                        predictor=PredictorSpec.parse("oracle").build(trace=generated_trace.trace),
                        told_reads=True,
                    )
                    fill_gap_closed([results["lru"], results["belady"], told])
                    forecaster = default_forecaster()
                    warm_up(forecaster, [training])
                    trained = replay_policy(prepared, "pbkv", capacity, predictor=forecaster)
                    fill_gap_closed([results["lru"], results["belady"], trained])
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
                            "trained_forecaster": trained.hit_rate,
                            "trained_forecaster_gap_closed": trained.gap_closed,
                            "perfect_forecasts_and_reads": told.hit_rate,
                            "perfect_forecasts_and_reads_gap_closed": told.gap_closed,
                        }
                    )
                    progress.advance(task)
    return rows


def markdown(rows: list[dict], command: str) -> str:
    """docs/results/heldout.md for `rows` (docs/results/heldout.json) and the command that measured them."""
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
        f"{DEFAULT_HORIZON} calls later, perfect forecasts can lose to the online ones. `trained forecaster`: pbkv",
        f"whose own forecaster first observed {TRAINING.workflows:,} workflows of the same family (seed {TRAINING.seed}),",
        "then served the trace as usual, learning on: what a long-running server knows of its app's agents, near",
        "the generator's own probabilities. Where it closes little more of the gap than the cold forecaster,",
        "what perfect forecasts add is not faster learning but which way each coin falls (another retry, another",
        "hop, another turn of the phase), which the agents called so far do not tell. `perfect forecasts and",
        "reads`: perfect forecasts, and pbkv told with each request how much of its path its agent's next request",
        "in the workflow reads again (`agentcache replay --told-reads`, read from the trace), valuing each",
        "latest path by that instead of the shares it learns: what is left between that and the reference is not",
        "what the trace's coins decide (which agent calls, whether a phase goes on) but how pbkv weighs what it",
        "knows.",
        "",
        "| family | points | pbkv >= best built-in | worst margin (pts) | median margin (pts) "
        "| gap closed >= 80% (dynamic families) | lowest gap closed | with a trained forecaster: >= 80% (dynamic) "
        "| lowest | with perfect forecasts: >= 80% (dynamic) | lowest "
        "| with perfect forecasts and reads: >= 80% (dynamic) | lowest |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for family in dict.fromkeys(r["family"] for r in rows):
        mine = [r for r in rows if r["family"] == family]
        margins = [r["margin"] * 100 for r in mine]
        closed = [r["gap_closed"] for r in mine if r["gap_closed"] is not None]
        enough = f"{sum(c >= 0.8 for c in closed)} of {len(closed)}" if family in DYNAMIC_FAMILIES else "n/a"
        lowest = f"{min(closed):.1%}" if closed else "n/a"
        others = []
        for column in (
            "trained_forecaster_gap_closed",
            "perfect_forecasts_gap_closed",
            "perfect_forecasts_and_reads_gap_closed",
        ):
            values = [r[column] for r in mine if r[column] is not None]
            others.append(f"{sum(c >= 0.8 for c in values)} of {len(values)}" if family in DYNAMIC_FAMILIES else "n/a")
            others.append(f"{min(values):.1%}" if values else "n/a")
        lines.append(
            f"| {family} | {len(mine)} | {sum(m >= -1e-9 for m in margins)} | {min(margins):+.2f} "
            f"| {statistics.median(margins):+.2f} | {enough} | {lowest} | {' | '.join(others)} |"
        )
    lines += [
        "",
        "Every point:",
        "",
        "| family | seed | capacity | lru | best built-in | pbkv | offline reference | margin (pts) | gap closed "
        "| pbkv, trained forecaster | gap closed | pbkv, perfect forecasts | gap closed "
        "| pbkv, perfect forecasts and reads | gap closed |",
        "|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        hit = r["hit_rate"]
        closed = "" if r["gap_closed"] is None else f"{r['gap_closed']:.1%}"
        variants = []
        for name in ("trained_forecaster", "perfect_forecasts", "perfect_forecasts_and_reads"):
            gap = r[f"{name}_gap_closed"]
            variants.append(f"{r[name]:.1%} | {'' if gap is None else f'{gap:.1%}'}")
        lines.append(
            f"| {r['family']} | {r['seed']} | {r['capacity']:,} | {hit['lru']:.1%} | {r['best_builtin']} "
            f"{hit[r['best_builtin']]:.1%} | {hit['pbkv']:.1%} | {hit['belady']:.1%} | {r['margin'] * 100:+.2f} | {closed} "
            f"| {' | '.join(variants)} |"
        )
    return "\n".join(lines) + "\n"


def write_docs(rows: list[dict], command: str) -> None:
    (RESULTS / "heldout.md").write_text(markdown(rows, command))
    (RESULTS / "heldout.json").write_text(json.dumps(rows, indent=1) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="comma-separated families (default: all)")
    args = parser.parse_args()
    families = args.only.split(",") if args.only else list(FAMILIES)
    rows = run(families)
    command = COMMAND + (f" --only {args.only}" if args.only else "")
    write_docs(rows, command)
    Console(stderr=True).print("wrote docs/results/heldout.md, docs/results/heldout.json")


if __name__ == "__main__":
    main()
