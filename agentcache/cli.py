"""The `agentcache` command line.

Each subcommand imports what it needs when it runs, so `agentcache gen` works
without SGLang and `--help` is instant.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Sequence

from rich.console import Console

from agentcache.engine.sglang_warnings import ignore_sglang_gpu_only_warnings
from agentcache.policy.pbkv import DEFAULT_ORDER
from agentcache.predictor.cli import output_problem
from agentcache.predictor.cli import register as add_predictor_commands
from agentcache.replay.report import UNLIMITED

console = Console(stderr=True)
DEFAULT_PREDICTOR = f"markov-n:{DEFAULT_ORDER}"  # pbkv's own default forecaster
BEST_BUILTIN = "best-builtin"  # every SGLang strategy, shown as the one that hit most at each capacity
REPLAY_POLICIES = f"lru,{BEST_BUILTIN},lifecycle,kvflow,cachescout,pbkv,belady,{UNLIMITED}"


class UsageError(Exception):
    """A bad argument or input file: printed as one line, exit status 2."""


def _check_server_flags(port: int, capacity: int | None, capacity_flag: str = "--capacity") -> None:
    """What a command that starts a server takes: said before SGLang starts (tens of seconds), not after as its
    traceback, or not at all (a port past 65535 was reported as served)."""
    if not 1 <= port <= 65535:
        raise UsageError(f"--port must be in 1-65535, got {port}")
    if capacity is not None and capacity < 1:
        raise UsageError(f"{capacity_flag} must be >= 1 token, got {capacity}")


def _check_output(flag: str, path: str | None) -> None:
    """A file the command writes at its end, checked at its start: a missing folder made a whole run end in a
    traceback, and a folder given as the file was written beside it (matplotlib: `<folder>.png`)."""
    problem = None if path is None else output_problem(path)
    if problem is not None:
        raise UsageError(f"{flag} {path}: {problem}")


# ---------------------------------------------------------------- gen


def _add_gen(sub: argparse._SubParsersAction) -> None:
    from agentcache.workloads import FAMILIES
    from agentcache.workloads.common import GenConfig

    d = GenConfig()
    p = sub.add_parser(
        "gen", help="generate a synthetic workflow trace", description="Generate a workflow trace (trace format v1)."
    )
    p.add_argument("family", choices=sorted(FAMILIES))
    p.add_argument("-o", "--output", required=True, help="trace file to write (JSON Lines)")
    p.add_argument(
        "--workflows",
        type=int,
        default=d.workflows,
        help="number of workflows; chat: conversations (default %(default)s)",
    )
    p.add_argument(
        "--rate", type=float, default=d.rate, help="new workflows per second; sets concurrency (default %(default)s)"
    )
    p.add_argument(
        "--fixed-tokens",
        type=int,
        default=d.fixed_tokens,
        help="mean fixed-prompt size per agent (default %(default)s)",
    )
    p.add_argument("--task-tokens", type=int, default=d.task_tokens, help="mean task size (default %(default)s)")
    p.add_argument(
        "--output-tokens", type=int, default=d.output_tokens, help="mean output per request (default %(default)s)"
    )
    p.add_argument("--tool-tokens", type=int, default=d.tool_tokens, help="mean tool result size (default %(default)s)")
    p.add_argument("--loop-prob", type=float, default=None, help="loop/branch probability (default: the family's)")
    p.add_argument(
        "--rebuild",
        type=float,
        default=None,
        help="probability that a call rebuilds its prompt from the shared context instead of extending the history"
        " (default: the family's)",
    )
    p.add_argument(
        "--unended", type=float, default=d.unended, help="share of workflows never ended (default %(default)s)"
    )
    p.add_argument("--seed", type=int, default=d.seed)
    p.set_defaults(run=_run_gen)


def _run_gen(args: argparse.Namespace) -> int:
    from agentcache.trace import write_trace
    from agentcache.workloads import generate
    from agentcache.workloads.common import GenConfig

    _check_output("-o", args.output)
    try:
        cfg = GenConfig(
            workflows=args.workflows,
            rate=args.rate,
            fixed_tokens=args.fixed_tokens,
            task_tokens=args.task_tokens,
            output_tokens=args.output_tokens,
            tool_tokens=args.tool_tokens,
            loop_prob=args.loop_prob,
            rebuild=args.rebuild,
            unended=args.unended,
            seed=args.seed,
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    trace = generate(args.family, cfg)
    write_trace(args.output, trace)
    requests = trace.requests
    console.print(
        f"wrote {args.output}: {len(requests)} requests, {len({r.workflow for r in requests})} workflows, "
        f"{sum(r.prompt_tokens for r in requests)} prompt tokens",
        markup=False,
    )
    return 0


# ---------------------------------------------------------------- replay


def _add_replay(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "replay",
        help="replay a trace through SGLang's radix cache per policy",
        description="Replay a workflow trace through SGLang 0.5.23's real UnifiedRadixCache, once per policy.",
    )
    p.add_argument("trace")
    p.add_argument("--capacity", required=True, help="KV capacity in tokens; several comma-separated")
    p.add_argument(
        "--policy",
        default=REPLAY_POLICIES,
        help="comma-separated policies: ours and SGLang's built-ins; best-builtin runs every SGLang strategy and"
        " shows the one that hit most at each capacity; unlimited adds a cache that never evicts, the ceiling (both"
        " with one cache, not with --instances) (default %(default)s; kvflow is skipped on a trace without a call"
        " graph)",
    )
    p.add_argument(
        "--lease",
        type=float,
        default=300.0,
        help="seconds without a request before a workflow is retired (default %(default)s)",
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
        "--instances",
        type=int,
        default=1,
        help="serve the trace with N modelled workers that split --capacity, in the timed replay (default 1)",
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
        help="with --instances: multiply arrival times by this; below 1 compresses them into more load (default 1)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON list, an object per run")
    p.add_argument("--plot", metavar="FILE.png", help="draw hit rate over time per policy")
    p.set_defaults(run=_run_replay)


def _parse_capacities(text: str) -> list[int]:
    try:
        caps = [int(c) for c in text.split(",") if c.strip()]
    except ValueError:
        raise UsageError(f"--capacity: expected token counts like 8000 or 4000,8000, got {text!r}") from None
    if not caps or any(c < 2 for c in caps):
        raise UsageError(f"--capacity: every capacity must be >= 2 tokens, got {text!r}")
    return caps


def _run_replay(args: argparse.Namespace) -> int:
    from agentcache.policy import PolicyConfigError, parse_policies
    from agentcache.policy.spec import BUILTINS
    from agentcache.predictor import PredictorSpec
    from agentcache.replay.report import best_of_group, plot_timeline, print_table
    from agentcache.replay.tokens import check_encodable
    from agentcache.trace import TraceError, read_trace

    capacities = _parse_capacities(args.capacity)
    _check_output("--plot", args.plot)
    try:
        trace = read_trace(args.trace)
        check_encodable(trace.requests)
    except (TraceError, OSError) as exc:
        raise UsageError(str(exc)) from None
    except ValueError as exc:
        raise UsageError(f"{args.trace}: {exc}") from None
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
    if (with_ceiling or grouped) and args.instances > 1:
        if args.policy != REPLAY_POLICIES:
            raise UsageError(f"--policy: {BEST_BUILTIN} and {UNLIMITED} compare one cache: not with --instances")
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
    if args.instances > 1 and spec.offline:
        raise UsageError("--predictor oracle follows one cache's requests in trace order: not with --instances")
    if args.instances > 1 and args.told_reads:
        raise UsageError("--told-reads follows one cache's requests in trace order: not with --instances")
    forecaster = None if own else str(spec)  # what the results say of whose forecasts they had

    def predictor_factory():  # noqa: ANN202
        return None if own else spec.build(trace.meta.call_graph, trace=trace)

    from agentcache.replay.runner import replay  # imports SGLang (~15 s)

    total = len(trace.requests) * (len(policies) * len(capacities) + with_ceiling)
    options = {"host_capacity": args.host_capacity, "lease_s": args.lease, "predictor_factory": predictor_factory}
    if args.instances < 1:
        raise UsageError(f"--instances must be >= 1, got {args.instances}")
    if args.instances > 1:
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
        labels = {"forecaster": forecaster, "told_reads": args.told_reads}
        print(json.dumps([{**r.to_json(), **labels} for r in results]))
    else:
        told = ", told reads" if args.told_reads else ""
        by = "" if forecaster is None else f", forecaster {forecaster}"
        print_table(shown, title=f"{trace.meta.name or args.trace}: {len(trace.requests)} requests{by}{told}")
        _note_oversized([(r.capacity, r.requests, r.oversized_requests) for r in results], 1)
    return 0


def _replay_cluster(args: argparse.Namespace, trace, policies, capacities, options, forecaster) -> int:  # noqa: ANN001
    """--instances N: the timed replay with N workers that split the capacity, per routing; `forecaster`: the one
    --predictor gave pbkv (None: each policy's own)."""
    from agentcache.policy import PolicyConfigError
    from agentcache.replay.cluster import RoutingError, parse_routings, replay_cluster
    from agentcache.replay.runner import PreparedTrace

    try:
        routings = parse_routings(args.routing)
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
        print(json.dumps([{**run, "forecaster": forecaster} for run in runs]))
        return 0
    from agentcache.replay.report import print_fitted_table

    title = f"{trace.meta.name or args.trace}: {args.instances} workers, time scale {args.time_scale:g}"
    if forecaster is not None:
        title += f", forecaster {forecaster}"
    headers = (
        "capacity",
        "policy",
        "routing",
        "hit rate",
        "TTFT p50 (s)",
        "TTFT p90 (s)",
        "req/s",
        "util",
        "imbalance",
    )
    rows = [
        (
            str(run["capacity"]),
            run["policy"],
            run["routing"],
            f"{run['hit_rate']:.1%}",
            f"{run['ttft_p50_s']:.3f}",
            f"{run['ttft_p90_s']:.3f}",
            f"{run['throughput_rps']:.2f}",
            f"{run['utilization']:.0%}",
            f"{run['imbalance']:.2f}",
        )
        for run in runs
    ]
    print_fitted_table(title, headers, rows)
    _note_oversized([(run["capacity"], run["requests"], run["oversized_requests"]) for run in runs], args.instances)
    return 0


def _note_oversized(runs: Sequence[tuple[int, int, int]], instances: int) -> None:
    """Say, per capacity, how many requests needed more KV than the cache (a worker's) holds: figures of a run
    where some or all did are not what they seem (every one a miss, or with workers, left out)."""
    worst: dict[int, tuple[int, int]] = {}
    for capacity, requests, oversized in runs:
        worst[capacity] = max(worst.get(capacity, (0, requests)), (oversized, requests))
    for capacity, (oversized, requests) in worst.items():
        if not oversized:
            continue
        if instances > 1:
            where = f"a worker holds ({capacity // instances:,} tokens of --capacity {capacity:,})"
            fate = "refused, as SGLang refuses them; the figures are the other requests'"
        else:
            where, fate = f"the cache holds (--capacity {capacity:,})", "each computed and never cached"
        console.print(
            f"{oversized:,} of {requests:,} requests need more KV (prompt and output) than {where}: {fate}",
            style="yellow",
            soft_wrap=True,
            markup=False,
        )


# ---------------------------------------------------------------- serve, make-model


def _add_serve(sub: argparse._SubParsersAction) -> None:
    from agentcache.server_ext.model import SIZES

    p = sub.add_parser(
        "serve",
        help="start SGLang with the agentcache plugin",
        description="Start SGLang 0.5.23 with the agentcache plugin. Extra SGLang flags go after `--`.",
    )
    p.add_argument("--model-path", help="model to serve (default: a small random-weight model made locally)")
    p.add_argument(
        "--model-size", choices=sorted(SIZES), default="small", help="size of the default model (default %(default)s)"
    )
    p.add_argument(
        "--policy",
        default="pbkv",
        help="eviction policy: lru, lifecycle, kvflow, cachescout, pbkv (default %(default)s)",
    )
    mode = p.add_mutually_exclusive_group()
    mode.add_argument(
        "--cpu", dest="cpu", action="store_true", default=None, help="CPU dev mode (default when there is no GPU)"
    )
    mode.add_argument("--gpu", dest="cpu", action="store_false", help="GPU mode")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument(
        "--max-total-tokens", type=int, help="KV capacity in tokens (CPU dev mode: 65536 unless given; GPU: SGLang's)"
    )
    p.add_argument("--hicache", action="store_true", help="enable SGLang's host-memory tier (HiCache)")
    p.add_argument("--lease", type=float, help="seconds without a request before a workflow is retired")
    p.add_argument("--call-graph", help="JSON file with the static call graph (for kvflow)")
    p.add_argument(
        "--predictor", help=f"pbkv's forecaster: markov, markov-n:N, neural:MODEL.pt (default {DEFAULT_PREDICTOR})"
    )
    p.add_argument("--api-key", help="API key the server requires (also on the agentcache routes)")
    p.add_argument(
        "--workers",
        type=int,
        default=1,
        help="N workers behind sglang-router on --port (manual policy, one routing slot per worker); agentcache_sdk "
        "routes each request workflow-aware by default (AGENTCACHE_ROUTING=workflow-affinity: each workflow on one)",
    )
    p.add_argument("sglang_args", nargs=argparse.REMAINDER, help="-- then extra SGLang flags")
    p.set_defaults(run=_run_serve)

    m = sub.add_parser("make-model", help="write a small random-weight model with a locally trained tokenizer")
    m.add_argument("output", help="directory to write")
    m.add_argument("--size", choices=sorted(SIZES), default="small", help="(default %(default)s)")
    m.set_defaults(run=_run_make_model)


def _run_serve(args: argparse.Namespace) -> int:
    from agentcache.server_ext.config import DEFAULT_LEASE_S, ConfigError, PluginConfig, SettingNames
    from agentcache.server_ext.launcher import ServeOptions, serve_forever

    _check_server_flags(args.port, args.max_total_tokens, "--max-total-tokens")
    lease = str(args.lease if args.lease is not None else DEFAULT_LEASE_S)  # the plugin's own checks, at once
    flags = SettingNames(
        policy="--policy",
        lease="--lease",
        call_graph="--call-graph",
        predictor="--predictor",
        other_policies="pbkv prefetches from host memory with --hicache; SGLang's own strategies need no plugin:"
        " run SGLang with --radix-eviction-policy",
    )
    try:
        PluginConfig.checked(args.policy, lease, args.call_graph, args.predictor, "conservative", flags)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    extra = args.sglang_args[1:] if args.sglang_args[:1] == ["--"] else args.sglang_args
    opts = ServeOptions(
        model_path=args.model_path,
        model_size=args.model_size,
        policy=args.policy,
        cpu=args.cpu,
        host=args.host,
        port=args.port,
        max_total_tokens=args.max_total_tokens,
        hicache=args.hicache,
        lease_s=args.lease,
        call_graph=args.call_graph,
        predictor=args.predictor,
        api_key=args.api_key,
        extra_args=extra,
    )
    if args.workers < 1:
        raise UsageError(f"--workers must be >= 1, got {args.workers}")
    if args.workers > 1:
        from agentcache.server_ext.cluster import serve_cluster_forever

        return serve_cluster_forever(opts, args.workers, router_port=args.port)
    return serve_forever(opts)


def _run_make_model(args: argparse.Namespace) -> int:
    from agentcache.server_ext.model import make_model

    path = make_model(args.output, args.size)
    console.print(f"wrote a {args.size} random-weight model to {path}", markup=False)
    return 0


# ---------------------------------------------------------------- demo


def _add_demo(sub: argparse._SubParsersAction) -> None:
    from agentcache.demo import DemoOptions

    d = DemoOptions()
    p = sub.add_parser(
        "demo",
        help="run concurrent multi-agent workflows against the bundled server, SGLang's strategies vs pbkv,"
        " measured fairly",
        description="Start the bundled SGLang server (CPU dev mode without a GPU) fresh for every policy and "
        "repetition, warm it up, run the same concurrent multi-agent workflows through the agentcache SDK "
        "(policies in alternating order), and compare hit rate and latency as medians over the repetitions.",
    )
    p.add_argument("--policies", default=",".join(d.policies), help="comma-separated (default %(default)s)")
    p.add_argument("--repeat", type=int, default=d.repeat, help="repetitions per policy (default %(default)s)")
    p.add_argument("--workflows", type=int, default=d.workflows, help="(default %(default)s)")
    p.add_argument("--concurrency", type=int, default=d.concurrency, help="workflows in flight (default %(default)s)")
    p.add_argument(
        "--capacity", type=int, default=d.capacity, help="server KV capacity in tokens (default %(default)s)"
    )
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--port", type=int, default=d.port)
    p.add_argument("--model-path", help="model to serve (default: a small random-weight model made locally)")
    p.add_argument("--log-dir", help="write each server's log here (default: a new temporary folder)")
    p.add_argument(
        "--record",
        metavar="TRACE.jsonl",
        help="record the workflows' LLM traffic (the first run with agentcache) as a trace for agentcache replay",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="end with one JSON line: {policy: {hit_rate, mean_latency_s, p90_latency_s, requests}}, medians",
    )
    p.set_defaults(run=_run_demo)


def _run_demo(args: argparse.Namespace) -> int:
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from agentcache.bench.report import median_range
    from agentcache.bench.runner import runs_on_plain_sglang
    from agentcache.bench.workload import BenchError
    from agentcache.demo import DemoOptions, ratio_lines, run_demo, summarize
    from agentcache.policy import PolicyConfigError, parse_policies
    from agentcache.replay.report import print_fitted_table

    try:
        specs = parse_policies(args.policies)
    except PolicyConfigError as exc:
        raise UsageError(f"--policies: {exc}") from None
    policies = tuple(spec.text for spec in specs)
    if args.workflows < 1 or args.concurrency < 1 or args.repeat < 1:
        raise UsageError("--workflows, --concurrency and --repeat must be >= 1")
    _check_server_flags(args.port, args.capacity)
    _check_output("--record", args.record)
    if args.record and all(runs_on_plain_sglang(spec) for spec in specs):
        raise UsageError(f"--record: {args.policies} runs on plain SGLang only, whose requests are not tagged")
    log_dir = args.log_dir or tempfile.mkdtemp(prefix="agentcache-demo-")
    console.print(f"server logs: {log_dir}", style="dim", markup=False)
    opts = DemoOptions(
        policies=policies,
        repeat=args.repeat,
        workflows=args.workflows,
        concurrency=args.concurrency,
        capacity=args.capacity,
        seed=args.seed,
        port=args.port,
        model_path=args.model_path,
        log_dir=log_dir,
        record=args.record,
    )
    columns = (
        SpinnerColumn(),
        TextColumn("{task.description}"),
        TextColumn("{task.completed} answers"),
        TimeElapsedColumn(),
    )
    try:
        with Progress(*columns, console=console, transient=True) as progress:
            task = progress.add_task("demo", total=None)
            runs = run_demo(
                opts,
                stage=lambda text: progress.update(task, description=text),
                answered=lambda: progress.advance(task),
            )
    except BenchError as exc:
        raise UsageError(f"{exc} (server logs: {log_dir})") from None
    results = summarize(runs)
    title = (
        f"{args.workflows} concurrent multi-agent workflows, KV capacity {args.capacity} tokens, "
        f"medians over {args.repeat} repetitions in alternating order"
    )
    rows = []
    for policy, r in results.items():
        mine = [run.mean_latency_s for run in runs if run.policy == policy]
        rows.append(
            (
                policy,
                f"{r['hit_rate']:.1%}",
                median_range(mine, ".2f"),
                f"{r['p90_latency_s']:.2f}",
                f"{r['requests']:.0f}",
            )
        )
    headers = ("policy", "hit rate", "mean latency (s)", "p90 latency (s)", "requests")
    print_fitted_table(title, headers, rows)
    for line in ratio_lines(runs):
        Console().print(line, soft_wrap=True, markup=False)
    if args.json:
        print(json.dumps(results))
    return 0


# ---------------------------------------------------------------- bench


def _add_bench(sub: argparse._SubParsersAction) -> None:
    from agentcache.bench.runner import CAPACITY_FACTOR, DEFAULT_POLICIES
    from agentcache.bench.workload import BENCH_FAMILY, BENCH_WORKFLOWS, MAX_NEW_TOKENS, TIME_SCALE, TOKEN_SCALE
    from agentcache.server_ext.model import SIZES

    p = sub.add_parser(
        "bench",
        help="live benchmark: a workload as real requests against the bundled server, per policy, measured fairly",
        description="Drive a trace (or a small generated workload) as real concurrent requests against a fresh "
        "bundled server per policy and repetition (warmed up; policies in alternating order), SGLang's own "
        "strategies on plain SGLang (--radix-eviction-policy), agentcache's on the plugin; report medians with "
        "min-max of time to first token, latency, completion time, prompt tokens computed and hit rate.",
    )
    from agentcache.workloads import FAMILIES

    workload = p.add_mutually_exclusive_group()
    workload.add_argument(
        "trace", nargs="?", help=f"trace file (default: {BENCH_WORKFLOWS} generated {BENCH_FAMILY} workflows)"
    )
    workload.add_argument(
        "--family",
        choices=sorted(FAMILIES),
        help=f"generate {BENCH_WORKFLOWS} workflows (or --workflows) of this family instead (default {BENCH_FAMILY})",
    )
    p.add_argument("--policy", default=DEFAULT_POLICIES, help="comma-separated (default %(default)s)")
    p.add_argument("--repeat", type=int, default=3, help="repetitions per policy, at least 3 (default %(default)s)")
    p.add_argument(
        "--workflows",
        type=int,
        help=f"use the trace's first N workflows (default: all), or generate N (default {BENCH_WORKFLOWS}; plain chat: "
        "N conversations, each turn a workflow of its own)",
    )
    p.add_argument(
        "--capacity", type=int, help=f"server KV capacity in tokens (default: {CAPACITY_FACTOR}x the mean prompt)"
    )
    p.add_argument(
        "--token-scale",
        type=float,
        default=TOKEN_SCALE,
        help="scale segment sizes; CPU prefill is slow (default %(default)s)",
    )
    p.add_argument(
        "--time-scale", type=float, default=TIME_SCALE, help="scale the trace's send times (default %(default)s)"
    )
    p.add_argument(
        "--max-new-tokens",
        type=int,
        default=MAX_NEW_TOKENS,
        help="cap on tokens generated per request (default %(default)s)",
    )
    p.add_argument("--model-path", help="model to serve (default: a random-weight model made locally)")
    p.add_argument("--model-size", choices=sorted(SIZES), default="small", help="(default %(default)s)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--cpu", dest="cpu", action="store_true", default=None, help="CPU mode (default without a GPU)")
    mode.add_argument("--gpu", dest="cpu", action="store_false", help="GPU mode")
    p.add_argument("--port", type=int, default=30300)
    p.add_argument("--log-dir", help="write each server's log here (default: a new temporary folder)")
    p.add_argument("--plot", metavar="FILE.png", help="draw the distributions of time to first token and latency")
    p.add_argument(
        "--json",
        action="store_true",
        help="end with one JSON line: per policy hit_rate, computed_prompt_tokens, runs, and ttft_s, latency_s, "
        "makespan_s as {median, min, max}",
    )
    p.set_defaults(run=_run_bench)


def _run_bench(args: argparse.Namespace) -> int:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from agentcache.bench.report import comparisons, median_range, plot
    from agentcache.bench.runner import BenchOptions, bench_trace
    from agentcache.bench.runs import summarize
    from agentcache.bench.workload import BENCH_FAMILY, BENCH_SEED, BENCH_WORKFLOWS, BenchError, first_workflows
    from agentcache.policy import PolicyConfigError, parse_policies
    from agentcache.replay.report import print_fitted_table
    from agentcache.trace import TraceError, read_trace
    from agentcache.workloads import GenConfig, generate

    try:
        policies = parse_policies(args.policy)
    except PolicyConfigError as exc:
        raise UsageError(f"--policy: {exc}") from None
    for spec in policies:
        if not spec.online or spec.prefetch:
            raise UsageError(
                f"--policy: {spec.text} cannot run live (offline references and prefetch variants are replay-only)"
            )
    if args.repeat < 3:
        raise UsageError(f"--repeat must be >= 3 (medians need repetitions), got {args.repeat}")
    for name in ("token_scale", "time_scale"):
        if getattr(args, name) <= 0:
            raise UsageError(f"--{name.replace('_', '-')} must be > 0")
    if args.workflows is not None and args.workflows < 1:
        raise UsageError(f"--workflows must be >= 1, got {args.workflows}")
    _check_server_flags(args.port, args.capacity)
    _check_output("--plot", args.plot)
    if args.trace:
        try:
            trace = read_trace(args.trace)
        except (TraceError, OSError) as exc:
            raise UsageError(str(exc)) from None
        trace = first_workflows(trace, args.workflows)
    else:  # `--workflows` of the family's (plain chat: conversations, each turn a workflow of its own)
        family = args.family or BENCH_FAMILY
        trace = generate(family, GenConfig(workflows=args.workflows or BENCH_WORKFLOWS, seed=BENCH_SEED))
    if not trace.requests:
        raise UsageError(f"{args.trace}: no requests to send")
    log_dir = args.log_dir or tempfile.mkdtemp(prefix="agentcache-bench-")
    console.print(f"server logs: {log_dir}", style="dim", markup=False)
    opts = BenchOptions(
        policies=tuple(policies),
        repeat=args.repeat,
        capacity=args.capacity,
        model_path=args.model_path,
        model_size=args.model_size,
        cpu=args.cpu,
        port=args.port,
        log_dir=log_dir,
    )
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    try:
        with Progress(*columns, console=console, transient=True) as progress:
            task = progress.add_task("bench", total=len(trace.requests) * len(policies) * args.repeat)
            runs, capacity = bench_trace(
                trace,
                opts,
                token_scale=args.token_scale,
                time_scale=args.time_scale,
                max_new_tokens=args.max_new_tokens,
                stage=lambda text: progress.update(task, description=text),
                answered=lambda: progress.advance(task),
            )
    except BenchError as exc:
        raise UsageError(f"{exc} (server logs: {log_dir})") from None
    summary = summarize(runs)
    name = trace.meta.name or args.trace
    title = (
        f"{name}: {len(trace.requests)} requests, {args.repeat} repetitions, KV capacity {capacity} tokens "
        "(medians, [min-max] over repetitions)"
    )
    rows = []
    for policy, r in summary.items():
        cells = [
            median_range([rep[k] for rep in r["repetitions"]], ".2f") for k in ("ttft_s", "latency_s", "makespan_s")
        ]
        rows.append((policy, f"{r['hit_rate']:.1%}", f"{r['computed_prompt_tokens']:,.0f}", *cells))
    headers = (
        "policy",
        "hit rate",
        "prompt tokens computed",
        "time to first token (s)",
        "latency (s)",
        "completion (s)",
    )
    print_fitted_table(title, headers, rows)
    for line in comparisons(runs):
        Console().print(line, soft_wrap=True, markup=False)
    if args.plot:
        plot(runs, args.plot, title=f"{name}: {len(trace.requests)} requests x {args.repeat} repetitions")
    if args.json:
        print(json.dumps(summary))
    return 0


# ---------------------------------------------------------------- main


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="agentcache", description="Workflow-aware KV-cache management for multi-agent LLM serving."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    _add_gen(sub)
    _add_replay(sub)
    _add_serve(sub)
    _add_demo(sub)
    _add_bench(sub)
    add_predictor_commands(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    ignore_sglang_gpu_only_warnings()
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except UsageError as exc:
        console.print(f"agentcache {args.command}: {exc}", style="red", soft_wrap=True, markup=False, highlight=False)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
