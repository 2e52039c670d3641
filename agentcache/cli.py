"""The `agentcache` command line.

Each subcommand imports what it needs when it runs, so `agentcache gen` works
without SGLang and `--help` is instant.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from rich.console import Console

console = Console(stderr=True)


class UsageError(Exception):
    """A bad argument or input file: printed as one line, exit status 2."""


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
    p.add_argument("--workflows", type=int, default=d.workflows, help="number of workflows (default %(default)s)")
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
        "--unended", type=float, default=d.unended, help="share of workflows never ended (default %(default)s)"
    )
    p.add_argument("--seed", type=int, default=d.seed)
    p.set_defaults(run=_run_gen)


def _run_gen(args: argparse.Namespace) -> int:
    from agentcache.trace import write_trace
    from agentcache.workloads import generate
    from agentcache.workloads.common import GenConfig

    try:
        cfg = GenConfig(
            workflows=args.workflows,
            rate=args.rate,
            fixed_tokens=args.fixed_tokens,
            task_tokens=args.task_tokens,
            output_tokens=args.output_tokens,
            tool_tokens=args.tool_tokens,
            loop_prob=args.loop_prob,
            unended=args.unended,
            seed=args.seed,
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    trace = generate(args.family, cfg)
    write_trace(args.output, trace)
    requests = trace.requests
    console.print(
        f"wrote {args.output}: {len(requests)} requests, {args.workflows} workflows, "
        f"{sum(r.prompt_tokens for r in requests)} prompt tokens"
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
        default="lru,lifecycle,kvflow,cachescout,pbkv,belady",
        help="comma-separated policies: ours and SGLang's built-ins (default %(default)s)",
    )
    p.add_argument(
        "--lease",
        type=float,
        default=300.0,
        help="seconds without a request before a workflow is retired (default %(default)s)",
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
    from agentcache.policy import PolicyConfigError
    from agentcache.replay.report import plot_timeline, print_table
    from agentcache.trace import TraceError, read_trace

    capacities = _parse_capacities(args.capacity)
    try:
        trace = read_trace(args.trace)
    except (TraceError, OSError) as exc:
        raise UsageError(str(exc)) from None
    from agentcache.replay.runner import parse_policies, replay  # imports SGLang (~15 s)

    try:
        policies = parse_policies(args.policy)
    except PolicyConfigError as exc:
        raise UsageError(str(exc)) from None
    total = len(trace.requests) * len(policies) * len(capacities)
    try:
        if args.json:
            results = replay(trace, policies, capacities, lease_s=args.lease)
        else:
            from rich.progress import Progress

            with Progress(console=console, transient=True) as progress:
                task = progress.add_task("replaying", total=total)
                results = replay(
                    trace, policies, capacities, lease_s=args.lease, on_request=lambda: progress.advance(task)
                )
    except PolicyConfigError as exc:
        raise UsageError(str(exc)) from None
    if args.plot:
        plot_timeline(results, args.plot, title=trace.meta.name or args.trace)
    if args.json:
        print(json.dumps([r.to_json() for r in results]))
    else:
        print_table(results, title=f"{trace.meta.name or args.trace}: {len(trace.requests)} requests")
    return 0


# ---------------------------------------------------------------- main


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="agentcache", description="Workflow-aware KV-cache management for multi-agent LLM serving."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    _add_gen(sub)
    _add_replay(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except UsageError as exc:
        console.print(f"[red]agentcache {args.command}: {exc}[/red]")
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
