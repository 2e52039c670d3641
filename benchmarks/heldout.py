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
import statistics
from dataclasses import replace

from ladder import replay_point
from pages import progress, save, template
from suite import CAPACITY_FACTORS, GENERATED, generated

from agentcache.policy.pbkv import default_forecaster
from agentcache.policy.spec import BUILTINS
from agentcache.predictor import PredictorSpec
from agentcache.predictor.base import DEFAULT_HORIZON
from agentcache.predictor.training import warm_up
from agentcache.replay.runner import PreparedTrace, fill_gap_closed, replay_policy
from agentcache.workloads import DYNAMIC_FAMILIES, FAMILIES, generate

SEEDS = (11, 22, 33)
POLICIES = ["lru", "pbkv", "belady", *BUILTINS]
# What pbkv's own forecaster knows after a long run of the same app: it first observes this many workflows of the
# family (another seed), then serves the held-out trace as usual. Where that barely moves pbkv, what is left is
# not learning too slowly but what the agents called so far cannot tell.
TRAINING = replace(GENERATED, seed=101, workflows=3000)


def run(families: list[str]) -> list[dict]:
    rows = []
    with progress("held-out seeds", len(families) * len(SEEDS) * len(CAPACITY_FACTORS)) as bar:
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
                    bar.advance()
    return rows


def markdown(rows: list[dict], command: str) -> str:
    """docs/results/heldout.md for `rows` (docs/results/heldout.json) and the command that measured them."""
    lines = [
        "# Held-out seeds: the ladder on workloads nobody tuned on",
        "",
        *template(
            "heldout/intro.md",
            command=command,
            seeds=", ".join(map(str, SEEDS)),
            suite_seed=GENERATED.seed,
            workflows=GENERATED.workflows,
            horizon=DEFAULT_HORIZON,
            training_workflows=f"{TRAINING.workflows:,}",
            training_seed=TRAINING.seed,
        ),
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


def page_of(saved: dict) -> str:
    """The page (but its Made by line), from what a run wrote (`pages.save`)."""
    return markdown(saved["rows"], saved["command"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="comma-separated families (default: all)")
    args = parser.parse_args()
    save("heldout", page_of, {"rows": run(args.only.split(",") if args.only else list(FAMILIES))})


if __name__ == "__main__":
    main()
