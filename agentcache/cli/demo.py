"""`agentcache demo`: the demo's multi-agent apps against the bundled server, one per policy, side by side."""

from __future__ import annotations

import argparse
import json
import tempfile

from rich.console import Console

from agentcache.bench.progress import BenchProgress
from agentcache.bench.report import median_range
from agentcache.bench.runner import runs_on_plain_sglang
from agentcache.bench.workload import BenchError
from agentcache.cli.common import UsageError, check_output, check_server_flags, console, live_policies
from agentcache.demo.run import DemoOptions, run_demo
from agentcache.demo.summary import ratio_lines, summarize, verdict
from agentcache.replay.report import print_fitted_table


def configure(p: argparse.ArgumentParser) -> None:
    d = DemoOptions()
    p.description = (
        "Start the bundled SGLang server (CPU dev mode without a GPU) once per policy, side by side, warm each up, "
        "and run the same concurrent multi-agent workflows on each (policies in alternating order, the cache "
        "emptied before every run); compare hit rate and latency as medians over the repetitions."
    )
    p.add_argument("--policies", default=",".join(d.policies), help="comma-separated (default %(default)s)")
    p.add_argument("--repeat", type=int, default=d.repeat, help="repetitions per policy (default %(default)s)")
    p.add_argument("--workflows", type=int, default=d.workflows, help="(default %(default)s)")
    p.add_argument("--concurrency", type=int, default=d.concurrency, help="workflows in flight (default %(default)s)")
    p.add_argument(
        "--capacity", type=int, default=d.capacity, help="server KV capacity in tokens (default %(default)s)"
    )
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--port", type=int, default=d.port, help="the first server's port; the others take the next ones")
    p.add_argument(
        "--fresh-servers",
        action="store_true",
        help="start a fresh server for every policy and repetition instead of emptying one per policy (slower)",
    )
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
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    specs = live_policies(args.policies, "--policies")
    policies = tuple(spec.text for spec in specs)
    if args.workflows < 1 or args.concurrency < 1 or args.repeat < 1:
        raise UsageError("--workflows, --concurrency and --repeat must be >= 1")
    check_server_flags(args.port, args.capacity)
    if not args.fresh_servers and args.port + len(specs) - 1 > 65535:
        raise UsageError(
            f"--port: the demo's {len(specs)} servers take --port and the ports after it; at most {65536 - len(specs)}"
        )
    check_output("--record", args.record)
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
        fresh_servers=args.fresh_servers,
        model_path=args.model_path,
        log_dir=log_dir,
        record=args.record,
    )
    try:
        with BenchProgress(console) as progress:
            runs = run_demo(opts, stage=progress.stage, answered=progress.answered)
    except BenchError as exc:
        raise UsageError(f"{exc} (server logs: {log_dir})") from None
    results = summarize(runs)
    title = (
        f"{args.workflows} multi-agent workflows, {args.concurrency} in flight, KV capacity {args.capacity} tokens: "
        f"medians [min-max] over {args.repeat} repetitions in alternating order"
    )
    rows = []
    for policy, r in results.items():
        mine = [run for run in runs if run.policy == policy]
        rows.append(
            (
                policy,
                median_range([run.hit_rate * 100 for run in mine], ".1f", "%"),
                median_range([run.mean_latency_s for run in mine], ".2f"),
                median_range([run.p90_latency_s for run in mine], ".2f"),
                f"{r['requests']:.0f}",
            )
        )
    headers = ("policy", "hit rate", "mean latency (s)", "p90 latency (s)", "requests")
    print_fitted_table(title, headers, rows)
    for line in [*ratio_lines(runs), *verdict(runs)]:
        Console().print(line, soft_wrap=True, markup=False)
    if args.json:
        print(json.dumps(results))
    return 0
