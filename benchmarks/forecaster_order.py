"""How many of a workflow's last agents pbkv's forecaster should remember: its hit rate per Markov order.

    .venv/bin/python benchmarks/forecaster_order.py          # about 20 minutes on 2 cores

pbkv's default forecaster is an online Markov model over a workflow's last DEFAULT_ORDER agents that backs
off to shorter contexts where the longer ones have too little data. This replays every generated family at
development seeds 5, 6 and 7 (neither the suite's seed nor the held-out seeds of benchmarks/heldout.py), at
4x, 8x and 16x each trace's mean prompt, with pbkv built exactly as by default but for the order (3 and
DEFAULT_ORDER unless --orders says otherwise), beside lru and the offline reference. Writes
docs/forecaster-order.md and docs/forecaster-order.json.
"""

from __future__ import annotations

import argparse
import json
import statistics

from rich.console import Console
from rich.progress import Progress
from suite import CAPACITY_FACTORS, DOCS, GENERATED, generated

from agentcache.policy.pbkv import DEFAULT_ORDER, default_forecaster
from agentcache.replay.runner import PreparedTrace, replay_policy
from agentcache.workloads import DYNAMIC_FAMILIES, FAMILIES

SEEDS = (5, 6, 7)


def run(families: list[str], orders: list[int]) -> list[dict]:
    rows = []
    with Progress(console=Console(stderr=True)) as progress:
        task = progress.add_task("forecaster orders", total=len(families) * len(SEEDS) * len(CAPACITY_FACTORS))
        for family in families:
            for seed in SEEDS:
                generated_trace = generated(family, seed)
                prepared = PreparedTrace(generated_trace.trace)
                for capacity in generated_trace.capacities:
                    hit = {p: replay_policy(prepared, p, capacity).hit_rate for p in ("lru", "belady")}
                    for order in orders:
                        hit[f"pbkv/order={order}"] = replay_policy(
                            prepared, "pbkv", capacity, predictor=default_forecaster(order)
                        ).hit_rate
                    rows.append({"family": family, "seed": seed, "capacity": capacity, "hit_rate": hit})
                    progress.advance(task)
    return rows


def gap_closed(hit: dict[str, float], policy: str) -> float | None:
    gap = hit["belady"] - hit["lru"]
    return (hit[policy] - hit["lru"]) / gap if gap > 1e-12 else None


def write_docs(rows: list[dict], orders: list[int], command: str) -> None:
    base, *others = orders
    lines = [
        "# pbkv's forecaster: how many of a workflow's last agents it remembers",
        "",
        f"Command: `{command}`. Every generated family at development seeds {', '.join(map(str, SEEDS))}",
        f"(the suite uses seed {GENERATED.seed}, docs/heldout.md seeds 11, 22 and 33), {GENERATED.workflows} workflows,",
        "capacities 4x / 8x / 16x the trace's mean prompt, replayed through SGLang's radix cache; pbkv as by",
        f"default (order {DEFAULT_ORDER}) but for its forecaster's order. Hit-rate differences in points against",
        f"order {base}; `gap closed`: the share of the LRU-to-offline-reference gap.",
        "",
        "| family | order | mean difference (pts) | lowest | highest | median gap closed | lowest gap closed |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    lowered: dict[int, list[str]] = {order: [] for order in others}  # order -> families whose mean it lowered
    for family in dict.fromkeys(r["family"] for r in rows):
        mine = [r["hit_rate"] for r in rows if r["family"] == family]
        for order in orders:
            policy = f"pbkv/order={order}"
            closed = [c for c in (gap_closed(h, policy) for h in mine) if c is not None]
            diffs = [(h[policy] - h[f"pbkv/order={base}"]) * 100 for h in mine]
            if order != base and statistics.mean(diffs) < 0:
                lowered[order].append(family)
            spread = (
                f"{statistics.mean(diffs):+.2f} | {min(diffs):+.2f} | {max(diffs):+.2f}"
                if order != base
                else "baseline | |"
            )
            lines.append(
                f"| {family} | {order} | {spread} | {statistics.median(closed):.0%} | {min(closed):.0%} |"
                if closed
                else f"| {family} | {order} | {spread} | n/a | n/a |"
            )
    lines.append("")
    for order, families in lowered.items():
        verdict = f"lower on {', '.join(families)}" if families else "no family lower"
        lines.append(f"- Order {order} against order {base}, mean per family: {verdict}.")
    lines += [
        "",
        f"Dynamic families (their path is decided at run time): {', '.join(sorted(DYNAMIC_FAMILIES))}.",
        "",
        "Every point (hit rate):",
        "",
        "| family | seed | capacity | lru | " + " | ".join(f"order {o}" for o in orders) + " | offline reference |",
        "|---|---:|---:|---:|" + "---:|" * len(orders) + "---:|",
    ]
    for r in rows:
        hit = r["hit_rate"]
        cells = " | ".join(f"{hit[f'pbkv/order={o}']:.1%}" for o in orders)
        lines.append(
            f"| {r['family']} | {r['seed']} | {r['capacity']:,} | {hit['lru']:.1%} | {cells} | {hit['belady']:.1%} |"
        )
    (DOCS / "forecaster-order.md").write_text("\n".join(lines) + "\n")
    (DOCS / "forecaster-order.json").write_text(json.dumps(rows, indent=1) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="comma-separated families (default: all)")
    parser.add_argument("--orders", default=f"3,{DEFAULT_ORDER}", help="Markov orders, the first the baseline")
    args = parser.parse_args()
    families = args.only.split(",") if args.only else list(FAMILIES)
    try:
        orders = [int(o) for o in args.orders.split(",")]
    except ValueError:
        parser.error(f"--orders: integers separated by commas, like 3,6; got {args.orders!r}")
    if len(orders) < 2 or min(orders) < 1:
        parser.error(f"--orders: at least two orders, each >= 1; got {args.orders!r}")
    rows = run(families, orders)
    command = ".venv/bin/python benchmarks/forecaster_order.py" + "".join(
        f" --{k} {v}" for k, v in (("only", args.only), ("orders", args.orders)) if v and v != f"3,{DEFAULT_ORDER}"
    )
    write_docs(rows, orders, command)
    Console(stderr=True).print("wrote docs/forecaster-order.md, docs/forecaster-order.json")


if __name__ == "__main__":
    main()
