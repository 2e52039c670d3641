"""The workloads a live bench serves, replayed: every generated family at the size `agentcache bench` sends.

    .venv/bin/python benchmarks/live_sized.py        # about 10 minutes on 2 cores

The ladder and the held-out seeds replay 150 workflows at full size. A live run on CPU serves far less:
16 workflows (plain chat: 16 conversations), segments scaled by 0.35, at most 4 tokens generated per
request and no output re-sent as the model wrote it (`agentcache.bench.as_served`). With a hundred
requests or so, what a policy learns online rests on little evidence, and a policy that wins at full
size can lose here, so this replays that regime through SGLang's radix cache: every family at seeds 1
to 8 (seed 7 is the live bench's), at 2x, 4x and 8x the mean prompt, with lru, every SGLang built-in,
pbkv and the offline reference; beside pbkv, pbkv with the plan (the same workload generated with the
`hints` knob: the plan and the next and agent_done events its framework would send; every other column
replays it without them). Writes docs/results/live-sized.md and docs/results/live-sized.json.
"""

from __future__ import annotations

import argparse
import statistics

from ladder import replay_point
from pages import progress, save, template
from suite import mean_prompt

from agentcache.bench.workload import BENCH_WORKFLOWS, MAX_NEW_TOKENS, TOKEN_SCALE, as_served
from agentcache.policy.spec import BUILTINS
from agentcache.replay.runner import PreparedTrace, replay_policy
from agentcache.workloads import FAMILIES, GenConfig, generate

SEEDS = tuple(range(1, 9))
CAPACITY_FACTORS = (2, 4, 8)
POLICIES = ["lru", "pbkv", "belady", *BUILTINS]
PLANNED = "pbkv with the plan"  # pbkv on the workload with its hints (the other columns: without them)


def run(families: list[str], policies: list[str]) -> list[dict]:
    rows = []
    with progress("live-sized workloads", len(families) * len(SEEDS) * len(CAPACITY_FACTORS)) as bar:
        for family in families:
            for seed in SEEDS:
                hinted = as_served(generate(family, GenConfig(workflows=BENCH_WORKFLOWS, seed=seed, hints=True)))
                trace = hinted.without(["next", "plan"])  # the same requests and ends, as generated without hints
                prepared, told_plan = PreparedTrace(trace), PreparedTrace(hinted)
                mean = mean_prompt(trace)
                for factor in CAPACITY_FACTORS:
                    capacity = int(mean * factor)
                    results, best = replay_point(prepared, capacity, POLICIES + policies)
                    hit = {p: r.hit_rate for p, r in results.items()}
                    hit[PLANNED] = replay_policy(told_plan, "pbkv", capacity).hit_rate
                    rows.append(
                        {
                            "family": family,
                            "seed": seed,
                            "requests": len(trace.requests),
                            "capacity": capacity,
                            "hit_rate": hit,
                            "best_builtin": best,
                            "margin": hit["pbkv"] - hit[best],
                            "margin_lru": hit["pbkv"] - hit["lru"],
                        }
                    )
                    bar.advance()
    return rows


def markdown(rows: list[dict], command: str, extra: list[str]) -> str:
    # pbkv with the plan beside pbkv, where the run measured it (a page made before it existed has none)
    extra = [PLANNED, *extra] if all(PLANNED in r["hit_rate"] for r in rows) else extra
    lines = [
        "# Live-sized workloads: the replay of what a live bench serves",
        "",
        *template(
            "live-sized/intro.md",
            command=command,
            first_seed=SEEDS[0],
            last_seed=SEEDS[-1],
            workflows=BENCH_WORKFLOWS,
            token_scale=TOKEN_SCALE,
            max_new_tokens=MAX_NEW_TOKENS,
        ),
        "",
        "| family | requests (median) | points | pbkv >= best built-in | pbkv >= lru | worst margin (pts) "
        "| median margin (pts) | worst margin over lru (pts) |" + "".join(f" `{p}` >= best built-in |" for p in extra),
        "|---|---:|---:|---:|---:|---:|---:|---:|" + "---:|" * len(extra),
    ]
    for family in dict.fromkeys(r["family"] for r in rows):
        mine = [r for r in rows if r["family"] == family]
        margins = [r["margin"] * 100 for r in mine]
        over_lru = [r["margin_lru"] * 100 for r in mine]
        lines.append(
            f"| {family} | {statistics.median(r['requests'] for r in mine):.0f} | {len(mine)} "
            f"| {_at_or_above_best(mine, 'pbkv')} | {sum(m >= -1e-9 for m in over_lru)} | {min(margins):+.2f} "
            f"| {statistics.median(margins):+.2f} | {min(over_lru):+.2f} |"
            + "".join(f" {_at_or_above_best(mine, p)} |" for p in extra)
        )
    lines.append(
        f"| all | | {len(rows)} | {_at_or_above_best(rows, 'pbkv')} | {sum(r['margin_lru'] >= -1e-9 for r in rows)} "
        f"| {min(r['margin'] for r in rows) * 100:+.2f} | {statistics.median(r['margin'] for r in rows) * 100:+.2f} "
        f"| {min(r['margin_lru'] for r in rows) * 100:+.2f} |"
        + "".join(f" {_at_or_above_best(rows, p)} |" for p in extra)
    )
    columns = ["lru", "best built-in", "pbkv", *extra, "offline reference", "margin (pts)"]
    lines += [
        "",
        "Every point:",
        "",
        "| family | seed | capacity | " + " | ".join(columns) + " |",
        "|---|---:|---:|" + "---:|" * len(columns),
    ]
    for r in rows:
        hit = r["hit_rate"]
        cells = [
            f"{hit['lru']:.1%}",
            f"{r['best_builtin']} {hit[r['best_builtin']]:.1%}",
            f"{hit['pbkv']:.1%}",
            *(f"{hit[p]:.1%}" for p in extra),
            f"{hit['belady']:.1%}",
            f"{r['margin'] * 100:+.2f}",
        ]
        lines.append(f"| {r['family']} | {r['seed']} | {r['capacity']:,} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _at_or_above_best(rows: list[dict], policy: str) -> int:
    return sum(r["hit_rate"][policy] >= r["hit_rate"][r["best_builtin"]] - 1e-9 for r in rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="comma-separated families (default: all)")
    parser.add_argument("--also", default="", help="comma-separated policies to report beside pbkv (e.g. ablations)")
    args = parser.parse_args()
    families = args.only.split(",") if args.only else list(FAMILIES)
    extra = [p for p in args.also.split(",") if p]
    rows = run(families, extra)
    save(
        "live-sized",
        lambda saved: markdown(saved["rows"], saved["command"], saved["also"]),
        {"rows": rows, "also": extra},
    )


if __name__ == "__main__":
    main()
