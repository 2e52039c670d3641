"""`agentcache bench`: a workload as real requests against a fresh bundled server per policy and repetition."""

from __future__ import annotations

import argparse
import json
import tempfile

from rich.console import Console

from agentcache.bench.forms import FORMS, OURS, parse_forms
from agentcache.bench.progress import BenchProgress
from agentcache.bench.report import comparisons, median_range, plot
from agentcache.bench.runner import CAPACITY_FACTOR, DEFAULT_POLICIES, BenchOptions, bench_trace
from agentcache.bench.runs import summarize
from agentcache.bench.workload import (
    BENCH_FAMILY,
    BENCH_SEED,
    BENCH_WORKFLOWS,
    MAX_NEW_TOKENS,
    TIME_SCALE,
    TOKEN_SCALE,
    BenchError,
    first_workflows,
)
from agentcache.cli.common import UsageError, check_output, check_server_flags, console, live_policies
from agentcache.replay.report import print_fitted_table
from agentcache.server_ext.model import SIZES
from agentcache.trace import TraceError, read_trace
from agentcache.workloads import FAMILIES, GenConfig, generate


def configure(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Drive a trace (or a small generated workload) as real concurrent requests against a fresh "
        "bundled server per policy and repetition (warmed up; policies in alternating order), SGLang's own "
        "strategies on plain SGLang (--radix-eviction-policy; session-lru and session-lfu: its session cache, "
        "--enable-session-radix-cache, each workflow a session closed at its end), agentcache's on the plugin; "
        "report medians with "
        "min-max of time to first token, latency, completion time, prompt tokens computed and hit rate, and of the "
        "time to first token of the calls that follow a tool (a trace's tool events go to the plugin's events route at"
        " their times; plain SGLang hears none) and each workflow's completion time (p50, p90)."
    )
    workload = p.add_mutually_exclusive_group()
    workload.add_argument(
        "trace", nargs="?", help=f"trace file (default: {BENCH_WORKFLOWS} generated {BENCH_FAMILY} workflows)"
    )
    workload.add_argument(
        "--family",
        choices=sorted(FAMILIES),
        help=f"generate {BENCH_WORKFLOWS} workflows (or --workflows) of this family instead (default {BENCH_FAMILY})",
    )
    p.add_argument(
        "--hints",
        action="store_true",
        help="with --family: the generated workflows also carry what their framework would know (the plan, next and"
        " agent_done events), sent to the plugin's events route; compare pbkv with pbkv/-plan",
    )
    p.add_argument("--policy", default=DEFAULT_POLICIES, help="comma-separated (default %(default)s)")
    p.add_argument(
        "--client-form",
        default=OURS,
        help="comma-separated: the forms agentcache's runs name workflows in, a run each per repetition (named "
        "`POLICY via FORM`; SGLang's own strategies run as a plain client would): "
        + "; ".join(f"{f.name}: {f.says}" for f in FORMS.values())
        + " (default %(default)s)",
    )
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
        "makespan_s, post_tool_ttft_p50_s, post_tool_ttft_p90_s (the calls that follow a tool; null without any), "
        "workflow_completion_p50_s, workflow_completion_p90_s as {median, min, max}, and per repetition each figure",
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    policies = live_policies(args.policy, "--policy")
    try:
        forms = parse_forms(args.client_form)
    except ValueError as exc:
        raise UsageError(f"--client-form: {exc}") from None
    if args.repeat < 3:
        raise UsageError(f"--repeat must be >= 3 (medians need repetitions), got {args.repeat}")
    for name in ("token_scale", "time_scale"):
        if getattr(args, name) <= 0:
            raise UsageError(f"--{name.replace('_', '-')} must be > 0")
    if args.workflows is not None and args.workflows < 1:
        raise UsageError(f"--workflows must be >= 1, got {args.workflows}")
    check_server_flags(args.port, args.capacity)
    check_output("--plot", args.plot)
    if args.trace and args.hints:
        raise UsageError("--hints generates a family's workflows with them (a trace file sends the ones it holds)")
    if args.trace:
        try:
            trace = read_trace(args.trace)
        except (TraceError, OSError) as exc:
            raise UsageError(str(exc)) from None
        trace = first_workflows(trace, args.workflows)
    else:  # `--workflows` of the family's (plain chat: conversations, each turn a workflow of its own)
        family = args.family or BENCH_FAMILY
        cfg = GenConfig(workflows=args.workflows or BENCH_WORKFLOWS, seed=BENCH_SEED, hints=args.hints)
        trace = generate(family, cfg)
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
        forms=forms,
    )
    try:
        with BenchProgress(console, requests_per_run=len(trace.requests)) as progress:
            runs, capacity = bench_trace(
                trace,
                opts,
                token_scale=args.token_scale,
                time_scale=args.time_scale,
                max_new_tokens=args.max_new_tokens,
                stage=progress.stage,
                answered=progress.answered,
            )
    except BenchError as exc:
        raise UsageError(f"{exc} (server logs: {log_dir})") from None
    summary = summarize(runs)
    name = trace.meta.name or args.trace
    title = (
        f"{name}: {len(trace.requests)} requests, {args.repeat} repetitions, KV capacity {capacity} tokens "
        "(medians, [min-max] over repetitions)"
    )
    # the calls that follow a tool where the trace has any; each workflow's completion time
    figures = {"ttft_s": "time to first token (s)", "latency_s": "latency (s)", "makespan_s": "completion (s)"}
    if any(rep["post_tool_requests"] for r in summary.values() for rep in r["repetitions"]):
        figures |= {
            "post_tool_ttft_p50_s": "after-tool TTFT p50 (s)",
            "post_tool_ttft_p90_s": "after-tool TTFT p90 (s)",
        }
    figures |= {"workflow_completion_p50_s": "workflow p50 (s)", "workflow_completion_p90_s": "workflow p90 (s)"}
    rows = []
    for policy, r in summary.items():
        cells = [median_range([rep[k] for rep in r["repetitions"]], ".2f") for k in figures]
        rows.append((policy, f"{r['hit_rate']:.1%}", f"{r['computed_prompt_tokens']:,.0f}", *cells))
    headers = ("policy", "hit rate", "prompt tokens computed", *figures.values())
    print_fitted_table(title, headers, rows)
    for line in comparisons(runs):
        Console().print(line, soft_wrap=True, markup=False)
    if args.plot:
        plot(runs, args.plot, title=f"{name}: {len(trace.requests)} requests x {args.repeat} repetitions")
    if args.json:
        print(json.dumps(summary))
    return 0
