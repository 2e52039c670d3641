"""Scale-out under load: every routing over N = 2, 4, 8 modelled SGLang workers, in the timed replay.

    nice -n 19 .venv/bin/python benchmarks/scale_out.py          # about 18 minutes on 2 cores

Writes the page and its figures beside it (docs/results/scale-out.{md,json}); `--render` writes the page again
from the figures alone.

Per trace and N, arrivals are compressed (`time_scale`) until round-robin
keeps the workers about 90% busy, then every routing serves the trace at that
pace and 1% either side of it; the page gives the medians over the three paces.
Each worker's KV pool holds 4x the trace's mean prompt (the suite's
tight capacity). The real traces have few workflows (5 and 80), too few
to load 8 workers, so they are tiled: copies with their own workflow ids and
conversations (the fixed prompts stay shared), started a fraction of the
trace's span apart (the time scale then sets the load). Rows run in a pool of
processes, one per core (`--processes`).

    nice -n 19 .venv/bin/python benchmarks/scale_out.py --seed 11   # held out: docs/results/scale-out-seed-11.md
    nice -n 19 .venv/bin/python benchmarks/scale_out.py --seed 22   # held out: docs/results/scale-out-seed-22.md

With `--seed`, the generated families at that seed alone (the suite uses seed 1): a
routing constant chosen on the suite's rows is checked on workloads it never saw.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import platform
import statistics
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import replace
from pathlib import Path

from pages import RESULTS, progress, render_again, save, template
from suite import mean_prompt, suite

from agentcache.replay.runner import PreparedTrace
from agentcache.replay.scale_out import ROUTINGS, replay_cluster
from agentcache.trace import Event, Request, Segment, Trace

INSTANCES = (2, 4, 8)
TARGET_UTILIZATION = 0.9
CALIBRATION_STEPS = 4
MIN_WORKFLOWS = 80  # a real trace is tiled up to at least this many workflows
DEFAULT_POLICY = "pbkv"
CAPACITY_PER_WORKER = 4  # x the trace's mean prompt: the suite's tight capacity
# Each row runs at its calibrated pace and 1% either side (arrival times x these) and the page gives medians:
# which request reaches a full worker first decides what it evicts, so one pace's verdict is partly chance.
PACES = (0.99, 1.0, 1.01)
MEDIAN_FIGURES = ("hit_rate", "ttft_p50_s", "ttft_p90_s", "throughput_rps", "imbalance", "utilization")


def tiled(trace: Trace, copies: int) -> Trace:
    """`copies` copies of a trace spread over its span: each with its own workflows and conversations, fixed
    prompts shared."""
    if copies <= 1:
        return trace
    starts: dict[str, float] = {}
    for event in trace.events:
        starts.setdefault(event.workflow, event.ts)
    span = (max(e.ts for e in trace.events) - min(starts.values())) or 1.0
    events: list[tuple[float, int, int, Event]] = []
    for copy in range(copies):
        shift, tag = copy * span / copies, f"#{copy}" if copy else ""
        for order, e in enumerate(trace.events):
            if not isinstance(e, Request):  # an end, a tool call: its workflow's copy, at its time
                events.append((e.ts + shift, copy, order, replace(e, ts=e.ts + shift, workflow=e.workflow + tag)))
                continue
            segments = tuple(
                s if i < e.fixed else Segment(s.content_id + tag, s.tokens) for i, s in enumerate(e.segments)
            )
            output_id = e.output_id + tag if e.output_id is not None else None
            request = Request(
                e.ts + shift, e.workflow + tag, e.agent, segments, e.fixed, e.output, output_id, e.app, e.prompt_hidden
            )
            events.append((e.ts + shift, copy, order, request))
    events.sort(key=lambda x: x[:3])
    return Trace(trace.meta, [x[3] for x in events])


def calibrate(prepared: PreparedTrace, policy: str, n: int, capacity: int) -> tuple[float, float]:
    """The time scale at which round-robin keeps `n` workers about TARGET_UTILIZATION busy, and that utilization."""
    scale, utilization = 1.0, 0.0
    for _ in range(CALIBRATION_STEPS):
        (run,) = replay_cluster(prepared, policy, n, capacity, ["round-robin"], time_scale=scale)
        utilization = run["utilization"]
        if abs(utilization - TARGET_UTILIZATION) < 0.05 or utilization <= 0:
            break
        # near saturation utilization hardly moves with the pace: slow down by half at once
        factor = 2.0 if utilization > 0.95 else utilization / TARGET_UTILIZATION
        scale = min(20.0, max(0.01, scale * factor))
    return scale, utilization


def serve_row(name: str, trace: Trace, capacity: int, copies: int, n: int, policy: str) -> dict:
    """One row: the pace at which round-robin keeps `n` workers busy, and every routing at each of PACES of it."""
    prepared = PreparedTrace(trace)
    scale, _ = calibrate(prepared, policy, n, capacity)
    paces = [
        {"pace": pace, "runs": replay_cluster(prepared, policy, n, capacity, ROUTINGS, time_scale=scale * pace)}
        for pace in PACES
    ]
    return {
        "trace": name,
        "copies": copies,
        "instances": n,
        "capacity": capacity,
        "time_scale": scale,
        "paces": paces,
    }


def run(policy: str, only: list[str] | None, seed: int | None = None, processes: int | None = None) -> list[dict]:
    """Every row of the page, served by a pool of processes (spawned: forked children can hang in torch)."""
    jobs = []
    for st in suite(only, seed):
        trace = st.trace
        workflows = len({r.workflow for r in trace.requests})
        copies = -(-MIN_WORKFLOWS // workflows) if st.real else 1
        capacity = int(CAPACITY_PER_WORKER * mean_prompt(trace))
        jobs += [(st.name, tiled(trace, copies), capacity, copies, n, policy) for n in INSTANCES]
    rows: list[dict | None] = [None] * len(jobs)
    workers = min(len(jobs), processes or os.cpu_count() or 1)
    with (
        progress(f"scale-out: {len(jobs)} rows on {workers} processes", len(jobs)) as bar,
        ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool,
    ):
        futures = {pool.submit(serve_row, *job): index for index, job in enumerate(jobs)}
        for future in as_completed(futures):
            row = rows[futures[future]] = future.result()
            bar.advance()
            cells = ", ".join(
                f"{routing} {figure['hit_rate']:.1%} p90 {figure['ttft_p90_s']:.3g}s"
                for routing, figure in medians(row).items()
            )
            bar.print(f"{row['trace']} N={row['instances']} x{row['time_scale']:.3g}, medians: {cells}")
    return [row for row in rows if row is not None]


def medians(row: dict) -> dict[str, dict[str, float]]:
    """Per routing, the median over the row's paces of each figure the page shows."""
    return {
        routing: {
            key: statistics.median(r[key] for pace in row["paces"] for r in pace["runs"] if r["routing"] == routing)
            for key in MEDIAN_FIGURES
        }
        for routing in ROUTINGS
    }


def verdict(runs: dict[str, dict]) -> tuple[bool, bool]:
    """(hit rate at or above cache-aware's, p90 TTFT below cache-aware's and workflow-affinity's)."""
    aware = runs["workflow-aware"]
    hit = aware["hit_rate"] >= runs["cache-aware"]["hit_rate"]
    p90 = aware["ttft_p90_s"] < min(runs["cache-aware"]["ttft_p90_s"], runs["workflow-affinity"]["ttft_p90_s"])
    return hit, p90


def markdown(rows: list[dict], command: str, policy: str, seconds: float, seed: int | None, machine: str) -> str:
    figures = [medians(row) for row in rows]
    checks = [verdict(figure) for figure in figures]
    both = sum(h and p for h, p in checks)
    # The Done-when at each pace apart, per row.
    at_pace = [[all(verdict({r["routing"]: r for r in pace["runs"]})) for pace in row["paces"]] for row in rows]
    pace_names = " / ".join(f"{pace:g}" for pace in PACES)
    lines = [
        "# Scale-out under load: routing over several SGLang workers"
        + ("" if seed is None else f", generated families at held-out seed {seed}"),
        "",
        f"Command: `{command}` ({machine}, {seconds:.0f} s).",
        "",
    ]
    if seed is not None:
        lines += [*template("scale-out/held-out.md", seed=seed), ""]
    method = {"policy": policy, "utilization": f"{TARGET_UTILIZATION:.0%}", "min_workflows": MIN_WORKFLOWS}
    lines += [
        *template("scale-out/method.md", paces=pace_names, **method),
        "",
        f"**Outcome: on the medians, the Done-when holds on {both} of {len(rows)} rows** (hit rate: "
        f"{sum(h for h, _ in checks)} of {len(rows)}; p90 TTFT: {sum(p for _, p in checks)} of {len(rows)}). "
        "At each pace apart: "
        + ", ".join(f"{sum(row[i] for row in at_pace)} at {pace:g}" for i, pace in enumerate(PACES))
        + f"; at all three: {sum(all(row) for row in at_pace)}, at none: {sum(not any(row) for row in at_pace)}"
        + f" (rows whose verdict changes within 1% of the pace: {sum(any(row) and not all(row) for row in at_pace)}).",
        "",
        *template("scale-out/reading.md"),
        # the history of the suite's own rows: what was tried on them and dropped, and what earlier runs said
        *(template("scale-out/history.md") if seed is None else []),
        *template("scale-out/closing.md"),
        "",
    ]
    header = ["trace", "N", "time scale", "rr util", *ROUTINGS, "hit >= ca", "p90 <", "each pace"]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row, figure, (hit, p90), paces in zip(rows, figures, checks, at_pace):
        cells = [
            f"{r['hit_rate']:.1%} · {r['ttft_p50_s']:.3g} / {r['ttft_p90_s']:.3g} · {r['throughput_rps']:.1f}"
            for r in (figure[name] for name in ROUTINGS)
        ]
        name = row["trace"] + (f" (x{row['copies']})" if row["copies"] > 1 else "")
        lines.append(
            f"| {name} | {row['instances']} | {row['time_scale']:.3g} | {figure['round-robin']['utilization']:.0%} | "
            + " | ".join(cells)
            + f" | {'yes' if hit else 'no'} | {'yes' if p90 else 'no'} | "
            + " / ".join("yes" if ok else "no" for ok in paces)
            + " |"
        )
    lines += ["", "Where workflow-aware wins and loses, row by row, on the medians (against cache-aware, `ca`, and", ""]
    lines[-2] += " workflow-affinity, `wfa`):"
    for row, figure, (hit, p90) in zip(rows, figures, checks):
        aware, ca, wfa = figure["workflow-aware"], figure["cache-aware"], figure["workflow-affinity"]
        name = f"{row['trace']} N={row['instances']}"
        hit_text = f"hit {aware['hit_rate']:.2%} vs ca {ca['hit_rate']:.2%}"
        p90_text = f"p90 {aware['ttft_p90_s']:.3g} s vs ca {ca['ttft_p90_s']:.3g} s, wfa {wfa['ttft_p90_s']:.3g} s"
        outcome = (
            "wins both"
            if hit and p90
            else "loses on " + " and ".join(what for what, ok in (("hit rate", hit), ("p90 TTFT", p90)) if not ok)
        )
        lines.append(f"- {name}: {outcome} ({hit_text}; {p90_text}).")
    lines += ["", "Mean over the rows' medians, per N (hit rate · TTFT p90 in s · worst token imbalance max/mean):", ""]
    lines += ["| N | " + " | ".join(ROUTINGS) + " |", "|" + "---|" * (1 + len(ROUTINGS))]
    for n in INSTANCES:
        group = [figure for row, figure in zip(rows, figures) if row["instances"] == n]
        if not group:
            continue
        cells = []
        for routing in ROUTINGS:
            runs = [figure[routing] for figure in group]
            hit = sum(r["hit_rate"] for r in runs) / len(runs)
            p90 = sum(r["ttft_p90_s"] for r in runs) / len(runs)
            cells.append(f"{hit:.1%} · {p90:.2f} · {max(r['imbalance'] for r in runs):.2f}")
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    lines += ["", *template("scale-out/live.md"), ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", help="trace names to run (default: the whole suite)")
    parser.add_argument("--policy", default=DEFAULT_POLICY, help="the workers' cache policy (default %(default)s)")
    parser.add_argument(
        "--seed", type=int, help="the generated families at this seed alone (held out: the suite uses seed 1)"
    )
    parser.add_argument(
        "--processes", type=int, help="rows served at once, one process each (default: one per CPU core)"
    )
    parser.add_argument(
        "--output",
        help="page to write (default docs/results/scale-out.md, docs/results/scale-out-seed-SEED.md with --seed); its figures go"
        " to the same name with .json",
    )
    parser.add_argument("--render", action="store_true", help="write the page again from its .json, running nothing")
    args = parser.parse_args(argv)
    if args.processes is not None and args.processes < 1:
        parser.error(f"--processes must be >= 1, got {args.processes}")
    output = Path(args.output or RESULTS / ("scale-out.md" if args.seed is None else f"scale-out-seed-{args.seed}.md"))
    if args.render:
        render_again(output.stem, page_of, folder=output.parent)
        return
    started = time.time()
    rows = run(args.policy, args.only, args.seed, args.processes)
    figures = {
        "policy": args.policy,
        "seconds": time.time() - started,
        "seed": args.seed,
        "machine": f"{platform.machine()}, Python {platform.python_version()}",
        "rows": rows,
    }
    save(output.stem, page_of, figures, folder=output.parent)


def page_of(saved: dict) -> str:
    """The page (but its Made by line), from what a run wrote beside it (`pages.save`)."""
    return markdown(saved["rows"], saved["command"], saved["policy"], saved["seconds"], saved["seed"], saved["machine"])


if __name__ == "__main__":
    main()
