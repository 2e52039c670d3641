"""`agentcache replay`: a trace through SGLang's radix cache once per policy and capacity, or in the timed replay
through one modelled worker (--timed) or N per routing (--instances): a table, a plot, or --json.

The replay itself (agentcache.replay.runner) imports SGLang (about 15 s): it loads once the arguments are checked.
"""

from __future__ import annotations

import argparse
import json
import warnings
from collections.abc import Sequence

from agentcache.cli.common import DEFAULT_PREDICTOR, UsageError, check_output, console
from agentcache.replay.results import UNLIMITED
from agentcache.trace import EVENT_GROUPS

# Every SGLang strategy (its session caches too), shown as the one that hit most at each capacity.
BEST_BUILTIN = "best-builtin"
REPLAY_POLICIES = f"lru,{BEST_BUILTIN},lifecycle,kvflow,cachescout,pbkv,belady,{UNLIMITED}"
EVENT_GROUP_HELP = [f"{group} ({', '.join(kind.TYPE for kind in kinds)})" for group, kinds in EVENT_GROUPS.items()]


def configure(p: argparse.ArgumentParser) -> None:
    p.description = "Replay a workflow trace through SGLang 0.5.23's real UnifiedRadixCache, once per policy."
    p.add_argument("trace")
    p.add_argument("--capacity", required=True, help="KV capacity in tokens; several comma-separated")
    p.add_argument(
        "--policy",
        default=REPLAY_POLICIES,
        help="comma-separated policies: ours and SGLang's built-ins (session-lru, session-lfu: its session cache,"
        " each workflow a session closed at its end); best-builtin runs every SGLang strategy and"
        " shows the one that hit most at each capacity; unlimited adds a cache that never evicts, the ceiling (both"
        " with one cache, not with --instances) (default %(default)s; kvflow is skipped on a trace without a call"
        " graph)",
    )
    p.add_argument(
        "--lease",
        type=float,
        default=300.0,
        help="seconds a workflow may go with no request in flight or arriving before it is retired (default %(default)s)",
    )
    p.add_argument(
        "--host-capacity", type=int, default=0, help="host-memory tier (HiCache) in tokens; 0: none (default)"
    )
    p.add_argument(
        "--predictor",
        help="the forecaster of pbkv and its variants (pbkv-paper, pbkv/-ingredient): markov, markov-n:N, static,"
        " neural:MODEL.pt, or oracle (each workflow's real next agents, read from the trace: what perfect forecasts"
        f" would give) (default: each policy's own; pbkv's is {DEFAULT_PREDICTOR})",
    )
    p.add_argument("--noise", type=float, default=0.0, help="mix pbkv's forecasts with uniform noise: (1-L) P + L U")
    p.add_argument(
        "--told-reads",
        action="store_true",
        help="tell pbkv and its variants, with each request, how much of its path its agent's next request in the"
        " workflow reads again (read from the trace), in place of the shares pbkv learns; with --predictor oracle:"
        " how far pbkv gets knowing what the trace's coins decide",
    )
    p.add_argument(
        "--ignore-events",
        metavar="GROUPS",
        default="",
        help="comma-separated groups of the trace's events to leave out, replaying the trace as if they were never"
        f" sent: {', '.join(EVENT_GROUP_HELP)} (default: none; requests and ends are always replayed)",
    )
    p.add_argument(
        "--instances",
        type=int,
        default=1,
        help="serve the trace with N modelled workers that split --capacity, in the timed replay (default 1)",
    )
    p.add_argument(
        "--timed",
        action="store_true",
        help="serve the trace in the timed replay (one modelled SGLang worker; --instances above 1 implies it):"
        " times to first token, those of the calls that follow a tool, and workflow completion times",
    )
    p.add_argument(
        "--routing",
        default="round-robin,power-of-two,cache-aware,workflow-affinity,workflow-aware",
        help="with --instances: comma-separated routings (default %(default)s)",
    )
    p.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        help="in the timed replay (--timed, --instances): multiply arrival times by this; below 1 compresses them into"
        " more load (default 1)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON list, an object per run")
    p.add_argument("--plot", metavar="FILE.png", help="draw hit rate over time per policy")
    p.set_defaults(run=run)


def _parse_event_groups(text: str) -> list[str]:
    groups = list(dict.fromkeys(g.strip() for g in text.split(",") if g.strip()))
    unknown = [g for g in groups if g not in EVENT_GROUPS]
    if unknown:
        raise UsageError(f"--ignore-events: unknown group {unknown[0]!r}; choose from {', '.join(EVENT_GROUPS)}")
    return groups


def _ignored_note(ignored: Sequence[str]) -> str:
    return f", {' and '.join(ignored)} events ignored" if ignored else ""


def _parse_capacities(text: str) -> list[int]:
    try:
        caps = [int(c) for c in text.split(",") if c.strip()]
    except ValueError:
        raise UsageError(f"--capacity: expected token counts like 8000 or 4000,8000, got {text!r}") from None
    if not caps or any(c < 2 for c in caps):
        raise UsageError(f"--capacity: every capacity must be >= 2 tokens, got {text!r}")
    return caps


def run(args: argparse.Namespace) -> int:
    from agentcache.policy import PolicyConfigError, parse_policies
    from agentcache.policy.spec import BUILTINS
    from agentcache.predictor import PredictorSpec
    from agentcache.replay.report import best_of_group, plot_timeline, print_table
    from agentcache.replay.tokens import check_encodable
    from agentcache.trace import TraceError, UnknownEventsWarning, read_trace

    capacities = _parse_capacities(args.capacity)
    check_output("--plot", args.plot)
    ignored = _parse_event_groups(args.ignore_events)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UnknownEventsWarning)  # said below, as a line of the command's own
            trace = read_trace(args.trace)
        check_encodable(trace.requests)
    except (TraceError, OSError) as exc:
        raise UsageError(str(exc)) from None
    except ValueError as exc:
        raise UsageError(f"{args.trace}: {exc}") from None
    if trace.skipped:
        kinds = ", ".join(f"{kind!r} x{count}" for kind, count in sorted(trace.skipped.items()))
        console.print(
            f"{args.trace}: left out events of types this agentcache does not know: {kinds}",
            style="yellow",
            soft_wrap=True,
            markup=False,
        )
    trace = trace.without(ignored)
    # KV pools are allocated whole: one far beyond what the trace can fill failed in the allocator.
    most = max(2, sum(r.prompt_tokens + r.output for r in trace.requests)) * max(1, args.instances)
    for flag, asked in (("--capacity", max(capacities)), ("--host-capacity", args.host_capacity)):
        if asked > most:
            console.print(
                f"{flag}: from {most:,} tokens up (the trace's prompts and outputs in all, on each instance) nothing"
                f" is ever evicted; replayed at {most:,}",
                style="dim",
                soft_wrap=True,
                markup=False,
            )
    capacities = list(dict.fromkeys(min(c, most) for c in capacities))
    args.host_capacity = min(args.host_capacity, most)
    if args.host_capacity < 0:
        raise UsageError(f"--host-capacity must be >= 0 tokens, got {args.host_capacity}")
    if not 0.0 <= args.noise <= 1.0:
        raise UsageError(f"--noise must be in [0, 1], got {args.noise}")
    names = list(dict.fromkeys(n.strip() for n in args.policy.split(",") if n.strip()))
    with_ceiling, grouped = UNLIMITED in names, BEST_BUILTIN in names
    timed = args.timed or args.instances > 1
    if (with_ceiling or grouped) and timed:
        if args.policy != REPLAY_POLICIES:
            raise UsageError(
                f"--policy: {BEST_BUILTIN} and {UNLIMITED} compare one untimed cache: not with --instances or --timed"
            )
        with_ceiling = grouped = False
    # The group's strategies in its place in the list, except those named on their own (shown on their own).
    grouped_builtins = [b for b in BUILTINS if b not in names] if grouped else []
    names = [m for n in names for m in (grouped_builtins if n == BEST_BUILTIN else [n]) if m != UNLIMITED]
    if not names:
        raise UsageError(f"--policy: name a policy to replay ({UNLIMITED} alone is nothing to compare)")
    try:
        policies = parse_policies(",".join(names))
    except PolicyConfigError as exc:
        raise UsageError(f"{exc} (the replay also takes {BEST_BUILTIN} and {UNLIMITED})") from None
    if not trace.meta.call_graph and any(p.name == "kvflow" for p in policies):
        if args.policy != REPLAY_POLICIES:
            raise UsageError(f"kvflow needs a static call graph, and {args.trace} has none (its meta call_graph)")
        console.print(
            f"kvflow skipped: {args.trace} has no call graph (kvflow needs one)",
            style="dim",
            soft_wrap=True,
            markup=False,
        )
        policies = [p for p in policies if p.name != "kvflow"]
    # Without --predictor (and noise) each policy keeps its own forecaster (pbkv-paper: Markov-1).
    own = args.predictor is None and args.noise == 0
    predictor_text = args.predictor or DEFAULT_PREDICTOR
    try:
        spec = PredictorSpec.parse(f"noise:{args.noise}:{predictor_text}" if args.noise > 0 else predictor_text)
        if not own:  # fail now, clearly, not in the middle of a replay
            spec.build(trace.meta.call_graph, trace=trace)
    except (ValueError, OSError) as exc:
        raise UsageError(f"--predictor: {exc}") from None
    if timed and spec.offline:
        raise UsageError(
            "--predictor oracle follows one cache's requests in trace order: not with --instances or --timed"
        )
    if timed and args.told_reads:
        raise UsageError("--told-reads follows one cache's requests in trace order: not with --instances or --timed")
    forecaster = None if own else str(spec)  # what the results say of whose forecasts they had

    def predictor_factory():  # noqa: ANN202
        return None if own else spec.build(trace.meta.call_graph, trace=trace)

    from agentcache.replay.runner import replay  # imports SGLang (~15 s)

    total = len(trace.requests) * (len(policies) * len(capacities) + with_ceiling)
    options = {"host_capacity": args.host_capacity, "lease_s": args.lease, "predictor_factory": predictor_factory}
    if args.instances < 1:
        raise UsageError(f"--instances must be >= 1, got {args.instances}")
    if timed:
        return _replay_cluster(args, trace, policies, capacities, options, forecaster)
    options["told_reads"] = args.told_reads
    from rich.progress import Progress

    try:
        with Progress(console=console, transient=True) as progress:  # on stderr: --json's stdout stays JSON
            task = progress.add_task("replaying", total=total)
            results = replay(
                trace,
                policies,
                capacities,
                on_request=lambda: progress.advance(task),
                with_ceiling=with_ceiling,
                **options,
            )
    except PolicyConfigError as exc:
        raise UsageError(str(exc)) from None
    shown = best_of_group(results, grouped_builtins)
    if args.plot:
        plot_timeline(shown, args.plot, title=trace.meta.name or args.trace)
    # A run with perfect forecasts, or told what is read, must not pass for pbkv's own: the table's title and
    # each JSON object say so (`forecaster`: null where every policy kept its own).
    if args.json:  # every run, the group's too
        labels = {"forecaster": forecaster, "told_reads": args.told_reads, "ignored_events": ignored}
        print(json.dumps([{**r.to_json(), **labels} for r in results]))
    else:
        told = (", told reads" if args.told_reads else "") + _ignored_note(ignored)
        by = "" if forecaster is None else f", forecaster {forecaster}"
        print_table(shown, title=f"{trace.meta.name or args.trace}: {len(trace.requests)} requests{by}{told}")
        _note_oversized([(r.capacity, r.requests, r.oversized_requests) for r in results], 1)
    return 0


def _replay_cluster(args: argparse.Namespace, trace, policies, capacities, options, forecaster) -> int:  # noqa: ANN001
    """The timed replay (--timed, or --instances N: N workers that split the capacity, per routing);
    `forecaster`: the one --predictor gave pbkv (None: each policy's own)."""
    from agentcache.policy import PolicyConfigError

    ignored = _parse_event_groups(args.ignore_events)  # the trace has them left out already
    from agentcache.replay.runner import PreparedTrace
    from agentcache.replay.scale_out import RoutingError, parse_routings, replay_cluster

    try:
        # one worker: every routing sends it all (the first listed names the run)
        routings = parse_routings(args.routing)[: 1 if args.instances == 1 else None]
    except RoutingError as exc:
        raise UsageError(f"--routing: {exc}") from None
    if args.time_scale <= 0:
        raise UsageError(f"--time-scale must be > 0, got {args.time_scale}")
    prepared = PreparedTrace(trace)

    def runs_for(on_request):  # noqa: ANN001, ANN202
        return [
            {"capacity": capacity, **run}
            for capacity in capacities
            for policy in policies
            for run in replay_cluster(
                prepared,
                policy,
                args.instances,
                capacity // args.instances,
                routings,
                time_scale=args.time_scale,
                host_capacity_per_instance=args.host_capacity // args.instances,
                predictor_factory=options["predictor_factory"],
                lease_s=args.lease,
                on_request=on_request,
            )
        ]

    from rich.progress import Progress

    total = len(trace.requests) * len(capacities) * len(policies) * len(routings)
    try:
        with Progress(console=console, transient=True) as progress:  # on stderr: --json's stdout stays JSON
            task = progress.add_task("serving", total=total)
            runs = runs_for(lambda: progress.advance(task))
    except (RoutingError, PolicyConfigError) as exc:
        raise UsageError(str(exc)) from None
    if args.json:
        print(json.dumps([{**run, "forecaster": forecaster, "ignored_events": ignored} for run in runs]))
        return 0
    from agentcache.replay.report import print_fitted_table

    workers = f"{args.instances} workers" if args.instances > 1 else "1 worker"
    title = f"{trace.meta.name or args.trace}: {workers}, time scale {args.time_scale:g}"
    title += _ignored_note(ignored)
    if forecaster is not None:
        title += f", forecaster {forecaster}"
    print_fitted_table(title, *_timed_table(runs, args.instances))
    _note_oversized(
        [(run["capacity"], run["requests"], run["oversized_requests"]) for run in runs], args.instances, timed=True
    )
    return 0


def _timed_table(runs: Sequence[dict], instances: int) -> tuple[list[str], list[list[str]]]:
    """The timed replay's headers and rows: routing and imbalance with several workers, the TTFT of the calls
    that follow a tool where any did."""
    columns = [
        ("capacity", lambda r: str(r["capacity"])),
        ("policy", lambda r: r["policy"]),
        *([("routing", lambda r: r["routing"])] if instances > 1 else []),
        ("hit rate", lambda r: f"{r['hit_rate']:.1%}"),
        ("TTFT p50 (s)", lambda r: f"{r['ttft_p50_s']:.3f}"),
        ("TTFT p90 (s)", lambda r: f"{r['ttft_p90_s']:.3f}"),
    ]
    if any(r["post_tool_requests"] for r in runs):
        columns += [
            ("after-tool TTFT p50 (s)", lambda r: _seconds(r["post_tool_ttft_p50_s"])),
            ("after-tool TTFT p90 (s)", lambda r: _seconds(r["post_tool_ttft_p90_s"])),
        ]
    columns += [
        ("workflow p50 (s)", lambda r: f"{r['workflow_completion_p50_s']:.2f}"),
        ("workflow p90 (s)", lambda r: f"{r['workflow_completion_p90_s']:.2f}"),
        ("req/s", lambda r: f"{r['throughput_rps']:.2f}"),
        ("util", lambda r: f"{r['utilization']:.0%}"),
        *([("imbalance", lambda r: f"{r['imbalance']:.2f}")] if instances > 1 else []),
    ]
    return [name for name, _ in columns], [[cell(run) for _, cell in columns] for run in runs]


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _note_oversized(runs: Sequence[tuple[int, int, int]], instances: int, *, timed: bool = False) -> None:
    """Say, per capacity, how many requests needed more KV than the cache (a worker's) holds: figures of a run
    where some or all did are not what they seem (every one a miss, or in the timed replay, left out)."""
    worst: dict[int, tuple[int, int]] = {}
    for capacity, requests, oversized in runs:
        worst[capacity] = max(worst.get(capacity, (0, requests)), (oversized, requests))
    for capacity, (oversized, requests) in worst.items():
        if not oversized:
            continue
        if instances > 1:
            where = f"a worker holds ({capacity // instances:,} tokens of --capacity {capacity:,})"
        else:
            where = f"the cache holds (--capacity {capacity:,})"
        if timed:
            fate = "refused, as SGLang refuses them; the figures are the other requests'"
        else:
            fate = "each computed and never cached"
        console.print(
            f"{oversized:,} of {requests:,} requests need more KV (prompt and output) than {where}: {fate}",
            style="yellow",
            soft_wrap=True,
            markup=False,
        )
