"""What each policy costs on the scheduler's hot path, at the cache sizes and concurrency a GPU serves.

    .venv/bin/python benchmarks/overhead.py --repeat 5   # docs/results/overhead.md's run: about 30 minutes on 2 cores
    .venv/bin/python benchmarks/overhead.py --quick      # one small point, a minute
    .venv/bin/python benchmarks/overhead.py --breakdown 100 200000   # where pbkv's time goes at one point

SGLang's scheduler is one Python thread, and every eviction round rebuilds its heap from every evictable
leaf, calling the strategy's `get_priority` on each (pbkv keeps its own heap across rounds instead). This replays code-retry workflows through SGLang's
real radix cache (the engine layer the server runs) at capacities of 50k / 200k / 800k tokens and
100 / 500 / 1,500 workflows in flight, and times the whole cache work of each request (match, insert,
eviction, the policy's bookkeeping) for lru, SGLang's lfu, pbkv and SGLang alone, each policy's replay in a
process of its own, the processes taking turns of TURN requests (`lockstep`). A second pass counts the eviction keys pbkv's heap asked for and those it computed. Writes docs/results/overhead.md and
docs/results/img/overhead.png.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import multiprocessing
import os
import platform
import pstats
import statistics
import sys
import time
import traceback
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from pages import RESULTS, progress, save, template  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

import agentcache  # noqa: E402
from agentcache import compiled  # noqa: E402
from agentcache.policy.pbkv import PBKVPolicy  # noqa: E402
from agentcache.replay import runner  # noqa: E402
from agentcache.replay.results import ReplayResult  # noqa: E402
from agentcache.replay.runner import PreparedTrace, replay_policy, replay_sglang_alone  # noqa: E402
from agentcache.trace import End, Trace  # noqa: E402
from agentcache.workloads import GenConfig, generate  # noqa: E402

CAPACITIES = (50_000, 200_000, 800_000)
IN_FLIGHT = (100, 500, 1_500)
POLICIES = ("lru", "lfu", "pbkv")
ALONE = "lfu alone"  # SGLang's lfu with no agentcache, on SGLang's default tree core: what a user runs
PROJECT = str(Path(agentcache.__file__).resolve().parent.parent)  # agentcache's code, and this benchmark's
MEAN_WORKFLOW_S = 25.0  # a code-retry workflow's mean duration at the default knobs: rate = in flight / duration
# Requests one policy's replay serves before the next policy's turn: some 20-40 ms of cache work here, shorter than
# the machine's swings in speed (tens of percent within seconds), longer than a turn's hand-over.
TURN = 50


@contextmanager
def frozen_garbage_collector() -> Iterator[None]:
    """What a replay runs in: the garbage before it collected (it pays for its own, not the one before it),
    and what exists then frozen, as SGLang 0.5.23's scheduler freezes its objects once the server warmed up
    (`/freeze_gc`, posted after warm-up): a full collection during the replay scans the objects made while
    serving, not the trace this benchmark holds."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def workload(in_flight: int, seed: int = 1) -> Trace:
    """Enough workflows to hold `in_flight` open for as long again as the ramp-up takes."""
    return generate("code-retry", GenConfig(workflows=2 * in_flight + 200, rate=in_flight / MEAN_WORKFLOW_S, seed=seed))


def mean_in_flight(trace: Trace) -> float:
    """Workflows open (first request seen, end not yet), averaged over time between the first and last event."""
    spans: dict[str, list[float]] = {}
    for e in trace.events:
        span = spans.setdefault(e.workflow, [e.ts, e.ts])
        span[1] = e.ts if isinstance(e, End) or e.ts > span[1] else span[1]
    start = min(s for s, _ in spans.values())
    stop = max(t for _, t in spans.values())
    return sum(t - s for s, t in spans.values()) / (stop - start) if stop > start else float(len(spans))


def _replay_in_turns(conn: Any, trace: Trace, policy: str, capacity: int, runs: int, turn: int) -> None:
    """A lockstep child: `runs` replays of `trace` with `policy`, `turn` requests at a time, waiting between turns
    for the parent's go; sends back each replay's result and the seconds of its turns (the waits not counted)."""
    turns: list[float] = []  # this run's
    served = 0
    started = 0.0

    def hand_over() -> None:
        nonlocal served, started
        served += 1
        if served % turn == 0:
            turns.append(time.perf_counter() - started)
            conn.send(None)
            conn.recv()
            started = time.perf_counter()

    try:
        prepared = PreparedTrace(trace)
        for _ in range(runs):
            turns, served = [], 0
            with frozen_garbage_collector():
                conn.send(None)  # ready: the garbage before this replay collected and the rest frozen
                conn.recv()
                started = time.perf_counter()
                if policy == ALONE:
                    result = replay_sglang_alone(prepared, "lfu", capacity, on_request=hand_over)
                else:
                    result = replay_policy(prepared, policy, capacity, on_request=hand_over)
                turns.append(time.perf_counter() - started)
            conn.send((result, turns))
    except BaseException:  # noqa: BLE001 - whatever failed, the parent says which policy and how
        conn.send(RuntimeError(f"{policy}'s replay failed:\n{traceback.format_exc()}"))


def lockstep(
    trace: Trace, capacity: int, policies: Sequence[str], runs: int, turn: int = TURN
) -> Iterator[dict[str, tuple[ReplayResult, float]]]:
    """`runs` times, each policy's replay of `trace`, in lockstep: every policy replays in a process of its own and
    the processes take turns of `turn` requests (who goes first rotating every round), so each policy's cache work
    is timed in the same stretches of the machine's time, which swings by tens of percent within seconds, faster
    than whole replays run one after another can pair away. Before each replay a process collects its garbage
    and freezes the rest (`frozen_garbage_collector`); it pays for its own collections. Yields, per run, each
    policy's result and its seconds of cache work (its turns summed). The processes are spawned, not forked:
    torch's thread pool does not survive a fork (a forked child's first large tensor hangs)."""
    context = multiprocessing.get_context("spawn")
    pipes, children = {}, []
    try:
        for policy in policies:
            ours, theirs = context.Pipe()
            child = context.Process(
                target=_replay_in_turns, args=(theirs, trace, policy, capacity, runs, turn), daemon=True
            )
            child.start()
            theirs.close()  # the child's end is the child's alone: its exit is an EOF here, not a hang
            pipes[policy] = ours
            children.append(child)
        order = list(policies)
        for _ in range(runs):
            for policy in policies:
                _message(pipes[policy], policy)  # ready
            done: dict[str, tuple[ReplayResult, float]] = {}
            while len(done) < len(order):
                for policy in [p for p in order if p not in done]:
                    pipes[policy].send(None)
                    message = _message(pipes[policy], policy)
                    if message is not None:
                        result, turns = message
                        done[policy] = (result, sum(turns))
                order = order[1:] + order[:1]
            yield done
    finally:
        for child in children:
            child.join(timeout=5)
            if child.is_alive():
                child.kill()


def _message(conn: Any, policy: str) -> Any:
    try:
        message = conn.recv()
    except EOFError:
        raise RuntimeError(f"{policy}'s replay process exited without its result") from None
    if isinstance(message, RuntimeError):
        raise message
    return message


def count_calls(prepared: PreparedTrace, policy: str, capacity: int) -> tuple[int, int]:
    """Python function calls (cProfile's count: deterministic, unlike wall time on a shared machine) in one replay,
    and of those the calls into agentcache's own code or made by it (the built-ins it calls). The rest is SGLang's
    tree code and the libraries it calls: it walks deeper into the tree where more of a prompt is cached."""
    profile = cProfile.Profile()
    profile.enable()
    try:
        replay_policy(prepared, policy, capacity)
    finally:
        profile.disable()
    stats = pstats.Stats(profile)
    ours = 0
    for (path, _, _), (_, calls, _, _, callers) in stats.stats.items():  # type: ignore[attr-defined]
        if _is_ours(path):
            ours += calls
        elif path == "~":  # a built-in: counted with the code that called it
            ours += sum(counts[0] for (caller, _, _), counts in callers.items() if _is_ours(caller))
    return stats.total_calls, ours  # type: ignore[attr-defined]


def _is_ours(path: str) -> bool:
    return path.startswith(PROJECT) and "site-packages" not in path


def count_keys(prepared: PreparedTrace, capacity: int) -> tuple[int, int]:
    """pbkv's eviction keys asked for (by its eviction heap) and computed (the rest were kept), in one replay."""
    build, built = runner.build_replay_cache, []

    def keep_cache(*args: Any) -> Any:  # the replay's cache, to read its policy's counts after the replay
        built.append(build(*args))
        return built[-1]

    runner.build_replay_cache = keep_cache
    try:
        replay_policy(prepared, "pbkv", capacity)
    finally:
        runner.build_replay_cache = build
    policy = built[0].policy
    return policy.keys_asked, policy.keys_computed


def breakdown(in_flight: int, capacity: int) -> dict[str, tuple[float, float]]:
    """Per request inside each of pbkv's entry points: milliseconds, in one replay with a timer around each (the
    timers add their own cost: read the shares, not the sum), and Python calls (built-ins included) in one more
    replay under a profile hook, which do not move with the machine."""
    from agentcache.engine.adapter import EvictionHeap, TaggedFullComponent
    from agentcache.policy.pbkv.score import Ranking

    points = {
        "request bookkeeping (on_request)": (PBKVPolicy, "on_request"),
        "  of which the forecast (on_transition)": (PBKVPolicy, "on_transition"),
        "  of which the periodic refresh (_refresh)": (PBKVPolicy, "_refresh"),
        "admissions (on_admit)": (PBKVPolicy, "on_admit"),
        "path tagging (tag_path)": (PBKVPolicy, "tag_path"),
        "workflow ends (on_end)": (PBKVPolicy, "on_end"),
        "eviction heap upkeep (sync)": (EvictionHeap, "sync"),
        "eviction picks (next node)": (TaggedFullComponent, "_evict_device_next_node"),
        "keys computed (Ranking.key)": (Ranking, "key"),
    }
    spent = dict.fromkeys(points, 0.0)
    originals = {label: getattr(owner, name) for label, (owner, name) in points.items()}

    def timed(label: str, function):  # noqa: ANN001, ANN202
        def run(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            started = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                spent[label] += time.perf_counter() - started

        return run

    prepared = PreparedTrace(workload(in_flight))
    inherited = {label for label, (owner, name) in points.items() if name not in vars(owner)}
    for label, (owner, name) in points.items():
        setattr(owner, name, timed(label, originals[label]))
    try:
        with frozen_garbage_collector():
            result = replay_policy(prepared, "pbkv", capacity)
    finally:
        for label, (owner, name) in points.items():
            if label in inherited:
                delattr(owner, name)
            else:
                setattr(owner, name, originals[label])
    calls = calls_within(prepared, capacity, {originals[label].__code__: label for label in points})
    per_request = {
        label: (seconds / result.requests * 1e3, calls[label] / result.requests) for label, seconds in spent.items()
    }
    return per_request | {
        "the whole replay": (result.replay_wall_s / result.requests * 1e3, calls[None] / result.requests)
    }


def calls_within(prepared: PreparedTrace, capacity: int, entries: dict[Any, str]) -> dict[str | None, int]:
    """Python calls (built-ins included) made inside each entry point (by its code object) in one pbkv replay,
    nested entries counted in each; under None, every call of the replay."""
    counts: dict[str | None, int] = dict.fromkeys([*entries.values(), None], 0)
    inside: list[tuple[Any, str]] = []  # (frame, label) of the entry points on the stack, outermost first

    def hook(frame, event, _arg) -> None:  # noqa: ANN001
        if event == "call" or event == "c_call":
            counts[None] += 1
            for label in {label for _, label in inside}:
                counts[label] += 1
            label = entries.get(frame.f_code) if event == "call" else None
            if label is not None:
                if all(entered != label for _, entered in inside):
                    counts[label] += 1
                inside.append((frame, label))
        elif event == "return" and inside and inside[-1][0] is frame:
            inside.pop()

    sys.setprofile(hook)
    try:
        replay_policy(prepared, "pbkv", capacity)
    finally:
        sys.setprofile(None)
    return counts


def measure(in_flights: tuple[int, ...], capacities: tuple[int, ...], repeat: int) -> list[dict]:
    rows = []
    order = [*POLICIES, ALONE]
    with progress("overhead grid", len(in_flights) * len(capacities) * (repeat * len(order) + 3)) as bar:
        for in_flight in in_flights:
            trace = workload(in_flight)
            prepared = PreparedTrace(trace)
            concurrency = mean_in_flight(trace)
            for capacity in capacities:
                ms: dict[str, list[float]] = {p: [] for p in order}
                hit: dict[str, float] = {}
                modelled_ms: dict[str, float] = {}
                for run in lockstep(trace, capacity, order, repeat):
                    for policy, (result, seconds) in run.items():
                        ms[policy].append(seconds / result.requests * 1e3)
                        hit[policy] = result.hit_rate
                        modelled_ms[policy] = result.modelled_latency_s / result.requests * 1e3
                        if policy == ALONE:
                            alone_label = result.policy
                    bar.advance(len(order))
                asked, computed = count_keys(prepared, capacity)
                bar.advance()
                calls, calls_ours = {}, {}
                for policy in ("lfu", "pbkv"):
                    total, ours = count_calls(prepared, policy, capacity)
                    calls[policy], calls_ours[policy] = total / len(prepared.encoded), ours / len(prepared.encoded)
                    bar.advance()
                row = {
                    "in_flight": in_flight,
                    "measured_in_flight": round(concurrency, 1),
                    "capacity": capacity,
                    "requests": len(prepared.encoded),
                    "ms_per_request": {p: statistics.median(v) for p, v in ms.items()},
                    "ms_spread": {p: [min(v), max(v)] for p, v in ms.items()},
                    "hit_rate": hit,
                    "pbkv_keys_asked_per_request": asked / len(prepared.encoded),
                    "pbkv_keys_computed_per_request": computed / len(prepared.encoded),
                    "python_calls_per_request": calls,
                    "python_calls_per_request_in_agentcache": calls_ours,
                }
                # Paired: each repetition's pbkv over the same repetition's baseline, so that what the machine
                # did in between (its speed drifts by tens of percent over minutes) cancels out.
                for name, baseline in (("pbkv_over_lfu", "lfu"), ("pbkv_over_lfu_alone", ALONE)):
                    ratios = [a / b for a, b in zip(ms["pbkv"], ms[baseline])]
                    row[name] = statistics.median(ratios)
                    row[name + "_spread"] = [min(ratios), max(ratios)]
                row["alone"] = alone_label
                # GPU time the cost model gives the prompts pbkv served from cache that lfu alone computed
                row["modelled_prefill_ms_saved_per_request"] = modelled_ms[ALONE] - modelled_ms["pbkv"]
                rows.append(row)
                bar.print(
                    f"in flight {in_flight} capacity {capacity}: "
                    + ", ".join(f"{p} {row['ms_per_request'][p]:.3f} ms" for p in (*POLICIES, ALONE))
                    + f"; pbkv/lfu {row['pbkv_over_lfu']:.2f}x, pbkv/lfu alone {row['pbkv_over_lfu_alone']:.2f}x"
                )
    return rows


def plot(rows: list[dict], path) -> None:  # noqa: ANN001
    fig, axes = plt.subplots(1, len({r["in_flight"] for r in rows}), figsize=(12, 3.6), sharey=True, squeeze=False)
    for ax, in_flight in zip(axes[0], sorted({r["in_flight"] for r in rows})):
        group = [r for r in rows if r["in_flight"] == in_flight]
        caps = [r["capacity"] / 1000 for r in group]
        for policy in (*POLICIES, ALONE):
            ax.plot(caps, [r["ms_per_request"][policy] for r in group], marker="o", label=policy)
        ax.set_xscale("log")
        ax.set_title(f"{in_flight} workflows in flight")
        ax.set_xlabel("capacity (k tokens)")
    axes[0][0].set_ylabel("cache work per request (ms)")
    axes[0][0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def markdown(rows: list[dict], command: str, repeat: int) -> str:
    lines = [
        "# The scheduler's hot path: cache work per request",
        "",
        f"Command: `{command}` ({platform.python_implementation()} {platform.python_version()},",
        "a process per policy on a 2-core machine; every figure below comes from that one run). The policy core",
        f"(`agentcache.compiled`) ran {compiled.active()}.",
        "",
        *template(
            "overhead/method.md",
            mean_workflow_s=f"{MEAN_WORKFLOW_S:.0f}",
            repeat=repeat,
            turn=TURN,
            alone=rows[0]["alone"],
        ),
        "",
        "| in flight (measured) | capacity | requests | lru ms/request | lfu ms/request | pbkv ms/request "
        "| lfu alone ms/request | pbkv / lfu | pbkv / lfu alone | pbkv - lfu alone: cache work / modelled prefill"
        " saved, ms per request | Python calls per request lfu / pbkv (in agentcache's code) "
        "| pbkv keys asked / computed per request | hit rate lru / lfu / pbkv / lfu alone |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        ms, spread, hit = r["ms_per_request"], r["ms_spread"], r["hit_rate"]
        cells = [f"{ms[p]:.3f} [{spread[p][0]:.3f}-{spread[p][1]:.3f}]" for p in (*POLICIES, ALONE)]
        lines.append(
            f"| {r['in_flight']} ({r['measured_in_flight']:.0f}) | {r['capacity']:,} | {r['requests']:,} | "
            + " | ".join(cells)
            + "".join(
                f" | {r[name]:.2f}x [{r[name + '_spread'][0]:.2f}-{r[name + '_spread'][1]:.2f}]"
                for name in ("pbkv_over_lfu", "pbkv_over_lfu_alone")
            )
            + f" | {ms['pbkv'] - ms[ALONE]:.2f} / {r['modelled_prefill_ms_saved_per_request']:.1f}"
            + " | "
            + " / ".join(
                f"{r['python_calls_per_request'][p]:,.0f} ({r['python_calls_per_request_in_agentcache'][p]:,.0f})"
                for p in ("lfu", "pbkv")
            )
            + f" | {r['pbkv_keys_asked_per_request']:.1f} / "
            + f"{r['pbkv_keys_computed_per_request']:.1f} | "
            + " / ".join(f"{hit[p]:.3f}" for p in (*POLICIES, ALONE))
            + " |"
        )
    worst = max(rows, key=lambda r: r["pbkv_over_lfu"])
    worst_alone = max(rows, key=lambda r: r["pbkv_over_lfu_alone"])
    best_alone = min(rows, key=lambda r: r["pbkv_over_lfu_alone"])
    dearer = [
        r
        for r in rows
        if r["ms_per_request"]["pbkv"] - r["ms_per_request"][ALONE] > r["modelled_prefill_ms_saved_per_request"]
    ]
    calls, ours = worst["python_calls_per_request"], worst["python_calls_per_request_in_agentcache"]
    extra, extra_ours = calls["pbkv"] - calls["lfu"], ours["pbkv"] - ours["lfu"]
    lines += [
        "",
        f"Worst point: pbkv costs {worst['pbkv_over_lfu']:.2f}x lfu ({worst['in_flight']} in flight, "
        f"{worst['capacity']:,} tokens). Against lfu alone, {best_alone['pbkv_over_lfu_alone']:.2f}x to "
        f"{worst_alone['pbkv_over_lfu_alone']:.2f}x. There pbkv makes {extra:,.0f} more Python calls per request"
        f" than lfu: {extra_ours:,.0f} in agentcache's code, {extra - extra_ours:,.0f} in SGLang's (its hit rate is"
        f" {worst['hit_rate']['pbkv']:.3f} against {worst['hit_rate']['lfu']:.3f}).",
        "",
        f"At {len(dearer)} of {len(rows)} points"
        + (
            " ("
            + ", ".join(f"{r['in_flight']} in flight / {r['capacity']:,}" for r in dearer)
            + ") the plugin's extra cache work per request is more than the modelled prefill its extra hits save:"
            " where pbkv's hit rate is close to lfu's, a scheduler that does not hide its CPU work behind the"
            " GPU's would lose more time than it gains."
            if dearer
            else " the plugin's extra cache work per request is more than the modelled prefill its extra hits save."
        ),
        "",
        "![cache work per request](img/overhead.png)",
        "",
        *template("overhead/notes.md"),
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one point (100 in flight, 50k tokens); writes nothing")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--breakdown",
        nargs=2,
        type=int,
        metavar=("IN_FLIGHT", "CAPACITY"),
        help="where pbkv's time goes at one point: ms per request in each of its entry points; writes nothing",
    )
    args = parser.parse_args()
    if args.breakdown and compiled.active().startswith("compiled"):
        # The timers wrap pbkv's methods, which a compiled class does not allow: the same code, from its source.
        Console(stderr=True).print("--breakdown times pbkv's methods by wrapping them: running its pure-Python modules")
        os.environ[compiled.PURE_ENV] = "1"
        os.execv(sys.executable, [sys.executable, *sys.argv])
    if args.breakdown:
        table = Table(title=f"pbkv, {args.breakdown[0]} in flight, capacity {args.breakdown[1]:,}")
        table.add_column("entry point")
        table.add_column("ms/request", justify="right")
        table.add_column("Python calls/request", justify="right")
        with Console(stderr=True).status("two pbkv replays: one timed, one counting calls"):
            spent = breakdown(*args.breakdown)
        for label, (ms, calls) in spent.items():
            table.add_row(label, f"{ms:.3f}", f"{calls:,.1f}")
        Console().print(table)
        return
    if args.quick:
        measure((100,), (50_000,), 1)
        return
    rows = measure(IN_FLIGHT, CAPACITIES, args.repeat)
    (RESULTS / "img").mkdir(exist_ok=True)
    plot(rows, RESULTS / "img" / "overhead.png")
    save("overhead", lambda saved: markdown(rows, saved["command"], args.repeat), {"rows": rows})


if __name__ == "__main__":
    main()
