"""The ladder's verdicts on seeds nobody tuned on: every generated family, three fresh seeds, three capacities.

    .venv/bin/python benchmarks/heldout.py           # about 10 minutes on 2 cores

The suite's figures come from one seed per family, the one used while the policies were built. This
replays the same families generated with seeds 11, 22 and 33 (never used in development), at 4x, 8x
and 16x each trace's mean prompt, with lru, every SGLang built-in, pbkv and the offline reference, and
reports per point pbkv's margin over the best built-in and the share of the LRU-to-offline-reference
gap it closes; beside it pbkv with the plan (the trace generated with the `hints` knob: the plan and the next
and agent_done events its framework would send; every other column replays it without them), with a forecaster
trained beforehand on the same family, with perfect forecasts, and with perfect forecasts and reads. Writes
docs/results/heldout.md and docs/results/heldout.json. `--only` reruns some families and keeps the other
families' rows from the last run, each row saying the commit that measured it. `--plan-only` measures the
column for pbkv with the plan alone, beside the last run's other columns, and replays pbkv without the hints
again at every point to check that it still hits what that run measured (it refuses to write otherwise):
minutes instead of the whole run's hour.
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import replace

from ladder import replay_point
from pages import load, progress, save, template
from suite import CAPACITY_FACTORS, GENERATED, mean_prompt

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
                hinted = generate(family, replace(GENERATED, seed=seed, hints=True))
                trace = hinted.without(["next", "plan"])  # the same requests and ends, as generated without hints
                prepared, told_plan = PreparedTrace(trace), PreparedTrace(hinted)
                for capacity in (int(mean_prompt(trace) * f) for f in CAPACITY_FACTORS):
                    results, best = replay_point(prepared, capacity, POLICIES)
                    hit = {p: r.hit_rate for p, r in results.items()}
                    planned = replay_policy(told_plan, "pbkv", capacity)
                    fill_gap_closed([results["lru"], results["belady"], planned])
                    oracle = PredictorSpec.parse("oracle").build(trace=trace)
                    perfect = replay_policy(prepared, "pbkv", capacity, predictor=oracle)
                    fill_gap_closed([results["lru"], results["belady"], perfect])
                    told = replay_policy(
                        prepared,
                        "pbkv",
                        capacity,
                        predictor=PredictorSpec.parse("oracle").build(trace=trace),
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
                            "with_plan": planned.hit_rate,
                            "with_plan_gap_closed": planned.gap_closed,
                            "with_plan_margin": planned.hit_rate - hit[best],
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


def with_plan(families: list[str], last: dict) -> list[dict]:
    """The last run's rows, with pbkv with the plan measured at each point of `families` (their other columns as
    that run measured them; pbkv without the hints replayed again to check that it still hits as then)."""
    rows = [dict(r) for r in last["rows"]]
    mine = [r for r in rows if r["family"] in families]
    with progress("held-out seeds, pbkv with the plan", len(mine)) as bar:
        for family in families:
            for seed in SEEDS:
                hinted = generate(family, replace(GENERATED, seed=seed, hints=True))
                trace = hinted.without(["next", "plan"])
                prepared, told_plan = PreparedTrace(trace), PreparedTrace(hinted)
                for r in (r for r in mine if r["family"] == family and r["seed"] == seed):
                    hit = r["hit_rate"]
                    again = replay_policy(prepared, "pbkv", r["capacity"]).hit_rate
                    if abs(again - hit["pbkv"]) > 1e-9:
                        raise SystemExit(
                            f"{family} seed {seed} at {r['capacity']}: pbkv without the hints hits {again:.4%}, the"
                            f" last run {hit['pbkv']:.4%}: rerun the whole page (without --plan-only)"
                        )
                    planned = replay_policy(told_plan, "pbkv", r["capacity"]).hit_rate
                    gap = hit["belady"] - hit["lru"]
                    r["with_plan"] = planned
                    r["with_plan_gap_closed"] = (planned - hit["lru"]) / gap if gap > 1e-12 else None
                    r["with_plan_margin"] = planned - hit[r["best_builtin"]]
                    bar.advance()
    return rows


def markdown(rows: list[dict], command: str, base: str | None = None) -> str:
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
        "| gap closed >= 80% (dynamic families) | lowest gap closed "
        "| with the plan: >= best built-in | >= 80% (dynamic) | lowest "
        "| with a trained forecaster: >= 80% (dynamic) "
        "| lowest | with perfect forecasts: >= 80% (dynamic) | lowest "
        "| with perfect forecasts and reads: >= 80% (dynamic) | lowest |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for family in dict.fromkeys(r["family"] for r in rows):
        mine = [r for r in rows if r["family"] == family]
        margins = [r["margin"] * 100 for r in mine]
        closed = [r["gap_closed"] for r in mine if r["gap_closed"] is not None]
        enough = f"{sum(c >= 0.8 for c in closed)} of {len(closed)}" if family in DYNAMIC_FAMILIES else "n/a"
        lowest = f"{min(closed):.1%}" if closed else "n/a"
        planned = [r for r in mine if r.get("with_plan") is not None]
        others = [f"{sum(r['with_plan_margin'] >= -1e-9 for r in planned)} of {len(planned)}" if planned else "n/a"]
        for column in (
            "with_plan_gap_closed",
            "trained_forecaster_gap_closed",
            "perfect_forecasts_gap_closed",
            "perfect_forecasts_and_reads_gap_closed",
        ):
            values = [r[column] for r in mine if r.get(column) is not None]
            counted = family in DYNAMIC_FAMILIES and values
            others.append(f"{sum(c >= 0.8 for c in values)} of {len(values)}" if counted else "n/a")
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
        "| pbkv with the plan | gap closed | pbkv, trained forecaster | gap closed | pbkv, perfect forecasts "
        "| gap closed | pbkv, perfect forecasts and reads | gap closed |",
        "|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        hit = r["hit_rate"]
        closed = "" if r["gap_closed"] is None else f"{r['gap_closed']:.1%}"
        variants = []
        for name in ("with_plan", "trained_forecaster", "perfect_forecasts", "perfect_forecasts_and_reads"):
            if r.get(name) is None:  # a row from a run before the column existed
                variants.append("— | —")
                continue
            gap = r[f"{name}_gap_closed"]
            variants.append(f"{r[name]:.1%} | {'' if gap is None else f'{gap:.1%}'}")
        lines.append(
            f"| {r['family']} | {r['seed']} | {r['capacity']:,} | {hit['lru']:.1%} | {r['best_builtin']} "
            f"{hit[r['best_builtin']]:.1%} | {hit['pbkv']:.1%} | {hit['belady']:.1%} | {r['margin'] * 100:+.2f} | {closed} "
            f"| {' | '.join(variants)} |"
        )
    if base is not None:
        lines += [
            "",
            f"Every column but pbkv with the plan is from the run at commit `{base}` (`--plan-only`); replayed again"
            " at this commit, pbkv without the hints hit what it hit then at every point.",
        ]
    carried = sorted({(r["commit"], r["family"]) for r in rows if r.get("commit")})
    if carried:
        commits = sorted({commit for commit, _ in carried})
        lines += [
            "",
            "Rows carried from an earlier run (`--only` reran the others): "
            + "; ".join(f"{', '.join(f for c, f in carried if c == commit)} at commit `{commit}`" for commit in commits)
            + ". A dash: that run had no such column.",
        ]
    return "\n".join(lines) + "\n"


def page_of(saved: dict) -> str:
    """The page (but its Made by line), from what a run wrote (`pages.save`)."""
    return markdown(saved["rows"], saved["command"], saved.get("base"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="comma-separated families (default: all)")
    parser.add_argument(
        "--plan-only",
        action="store_true",
        help="measure pbkv with the plan alone, beside the last run's other columns (checked: pbkv without hints)",
    )
    args = parser.parse_args()
    families = args.only.split(",") if args.only else list(FAMILIES)
    if args.plan_only:
        last = load("heldout")
        save("heldout", page_of, {"rows": with_plan(families, last), "base": last.get("base") or last["commit"]})
        return
    rows = run(families)
    if args.only:  # the other families as the last run measured them, each row with its commit
        last = load("heldout")
        kept = [{**r, "commit": r.get("commit") or last["commit"]} for r in last["rows"] if r["family"] not in families]
        order = list(dict.fromkeys([*(r["family"] for r in last["rows"]), *families]))
        rows = sorted(kept + rows, key=lambda r: order.index(r["family"]))
    save("heldout", page_of, {"rows": rows})


if __name__ == "__main__":
    main()
