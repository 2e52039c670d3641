"""The replay ladder: every policy on every trace of the suite at three capacities.

    .venv/bin/python benchmarks/ladder.py            # about 15 minutes on 2 cores

Beside the policies: the offline reference (`belady`: with the whole trace
known, evict the node whose next use is farthest away; over radix nodes of
different sizes a strong heuristic, not a proven optimum, and an online policy
can beat it) and the unlimited cache (what no eviction at all would hit: the
ceiling).

Beside pbkv, on the generated families: pbkv with the plan (the same trace generated with the `hints` knob,
with the plan and the next and agent_done events its framework would send; every other column replays it
without them).

Writes docs/results/benchmarks.md (tables), docs/results/benchmarks.json (every run),
docs/results/img/ladder-<trace>.png (hit rate over time at the tightest capacity) and,
on a full run, the summary table in README.md. `--readme` rewrites only that
table, from docs/results/benchmarks.json.
"""

from __future__ import annotations

import argparse
import platform
from dataclasses import replace

from pages import RESULTS, ROOT, load, progress, save, template, write_between_markers
from suite import GENERATED, suite

from agentcache.policy.spec import BUILTINS
from agentcache.replay.report import plot_timeline
from agentcache.replay.results import UNLIMITED, ReplayResult
from agentcache.replay.runner import PreparedTrace, ceiling, fill_gap_closed, replay_policy
from agentcache.workloads import generate

OURS = ["lru", "lifecycle", "kvflow", "cachescout", "pbkv-paper", "pbkv", "belady"]
PLANNED = "pbkv with the plan"  # pbkv on a generated trace with its hints (every other column: without them)


def replay_point(prepared: PreparedTrace, capacity: int, policies: list[str]) -> tuple[dict[str, ReplayResult], str]:
    """Every one of `policies` (lru, belady and every built-in among them) replayed at one capacity, each with
    its share of the LRU-to-offline-reference gap; and which of SGLang's built-ins hit most there."""
    results = {p: replay_policy(prepared, p, capacity) for p in policies}
    fill_gap_closed(list(results.values()))
    return results, max(BUILTINS, key=lambda b: results[b].hit_rate)


def run(only: list[str] | None) -> list[tuple[str, list[ReplayResult]]]:
    traces = list(suite(only))
    policies = [*OURS, *BUILTINS]
    out = []
    runs = sum(len(t.trace.requests) * len(t.capacities) * (len(policies) + (not t.real)) for t in traces)
    with progress("ladder", runs) as bar:
        for st in traces:
            prepared = PreparedTrace(st.trace)
            results = [
                replay_policy(prepared, name, capacity, on_request=bar.advance)
                for capacity in st.capacities
                for name in policies
            ]
            if not st.real:  # the same trace with its hints, as the family's framework would send them
                told_plan = PreparedTrace(generate(st.name, replace(GENERATED, hints=True)))
                for capacity in st.capacities:
                    planned = replay_policy(told_plan, "pbkv", capacity, on_request=bar.advance)
                    results.append(replace(planned, policy=PLANNED))
            fill_gap_closed(results)
            results += ceiling(prepared, st.capacities)
            out.append((st.name, results))
            plot_timeline(
                [
                    r
                    for r in results
                    if r.capacity == st.capacities[0] and r.policy in ("lru", "lfu", "pbkv-paper", "pbkv", "belady")
                ],
                str(RESULTS / "img" / f"ladder-{st.name}.png"),
                title=st.name,
            )
    return out


def cell(r: ReplayResult) -> str:
    gap = "" if r.gap_closed is None or r.policy in ("lru", "belady", UNLIMITED) else f" ({r.gap_closed:+.0%})"
    return f"{r.hit_rate:.1%}{gap}"


def page_of(saved: dict) -> str:
    """The page (but its Made by line), from what a run wrote (`pages.save`): every run's figures."""
    by_trace: dict[str, list[ReplayResult]] = {}
    for record in saved["runs"]:
        fields = {k: v for k, v in record.items() if k not in ("trace", "hit_rate")}
        by_trace.setdefault(record["trace"], []).append(ReplayResult(**fields))
    return markdown(list(by_trace.items()), saved["command"])


def markdown(runs: list[tuple[str, list[ReplayResult]]], command: str) -> str:
    lines = [
        "# Replay benchmark: every policy through SGLang's radix cache",
        "",
        f"Command: `{command}` ({platform.machine()}, Python {platform.python_version()}).",
        *template(
            "ladder/intro.md",
            builtins=", ".join(b for b in BUILTINS if any(r.policy == b for _, results in runs for r in results)),
        ),
        "",
    ]
    # pbkv with the plan beside pbkv, where the run measured it (a page made before it existed has none)
    ours = (
        OURS[:]
        if not any(r.policy == PLANNED for _, results in runs for r in results)
        else OURS[:-1] + [PLANNED, "belady"]
    )
    header = ["trace", "capacity", *ours, UNLIMITED, "best built-in", "pbkv vs best built-in", "pbkv GPU time vs lru"]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name, results in runs:
        for capacity in sorted({r.capacity for r in results}):
            by = {r.policy: r for r in results if r.capacity == capacity}
            # the built-ins a run had (a page made before SGLang's session cache joined BUILTINS has fewer)
            builtins = [by[b] for b in BUILTINS if b in by]
            builtin = max(builtins, key=lambda r: r.hit_rate)
            online = [by[p] for p in ours if p != "belady" and p in by] + builtins
            best = max(r.hit_rate for r in online)
            cells = [
                "—"
                if p not in by
                else f"**{cell(by[p])}**"
                if p != "belady" and by[p].hit_rate == best
                else cell(by[p])
                for p in ours
            ]
            cells.append(cell(by[UNLIMITED]))
            delta = by["pbkv"].hit_rate - builtin.hit_rate
            speed = by["lru"].modelled_latency_s / by["pbkv"].modelled_latency_s
            lines.append(
                f"| {name} | {capacity} | "
                + " | ".join(cells)
                + f" | {builtin.policy} {cell(builtin)} | {delta * 100:+.1f} pts | {speed:.2f}x |"
            )
    lines += ["", "Hit rate over time at the tightest capacity: `docs/results/img/ladder-<trace>.png`.", ""]
    return "\n".join(lines)


README = ROOT / "README.md"


def readme_table(rows: list[dict]) -> str:
    """The README's summary: LRU, the best built-in, pbkv, the offline reference and the ceiling, from
    docs/results/benchmarks.json's runs."""
    planned = any(r["policy"] == PLANNED for r in rows)  # a run made before the column existed has none
    lines = [
        "| trace | capacity | lru | best built-in | pbkv |"
        + (f" {PLANNED} |" if planned else "")
        + " offline reference | unlimited cache |",
        "|---|---|---|---|---|" + ("---|" if planned else "") + "---|---|",
    ]
    points = dict.fromkeys((r["trace"], r["capacity"]) for r in rows)
    below = []
    for trace, capacity in points:
        by = {r["policy"]: r for r in rows if r["trace"] == trace and r["capacity"] == capacity}
        builtin = max((by[b] for b in BUILTINS), key=lambda r: r["hit_rate"])
        pbkv = by["pbkv"]
        gap = "" if pbkv["gap_closed"] is None else f" ({pbkv['gap_closed']:+.0%})"
        told = by.get(PLANNED)
        with_plan = "" if not planned else " — |" if told is None else f" {told['hit_rate']:.1%} |"
        lines.append(
            f"| {trace} | {capacity} | {by['lru']['hit_rate']:.1%} | {builtin['policy']} {builtin['hit_rate']:.1%}"
            f" | **{pbkv['hit_rate']:.1%}**{gap} |{with_plan} {by['belady']['hit_rate']:.1%}"
            f" | {by[UNLIMITED]['hit_rate']:.1%} |"
        )
        if pbkv["hit_rate"] < builtin["hit_rate"]:
            below.append(
                f"{trace} at {capacity} ({pbkv['hit_rate']:.1%} against {builtin['policy']} {builtin['hit_rate']:.1%})"
            )
    lines.append("")
    verdict = f"`pbkv` is at or above the best built-in at {len(points) - len(below)} of {len(points)} points"
    lines.append(verdict + (f"; below it at {', '.join(below)}." if below else "."))
    return "\n".join(lines) + "\n"


def write_readme_table() -> None:
    write_between_markers(README, "ladder", readme_table(load("benchmarks")["runs"]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", help="trace names to run (default: the whole suite)")
    parser.add_argument(
        "--readme", action="store_true", help="only rewrite README.md's ladder table from the last full run"
    )
    args = parser.parse_args()
    if args.readme:
        write_readme_table()
        return
    runs = run(args.only)
    records = [{"trace": name, **r.to_json()} for name, results in runs for r in results]
    save("benchmarks", page_of, {"runs": records})
    if not args.only:
        write_readme_table()


if __name__ == "__main__":
    main()
