"""`agentcache gen`: write a synthetic workflow trace of one of the generated families."""

from __future__ import annotations

import argparse

from agentcache.cli.common import UsageError, check_output, console
from agentcache.trace import write_trace
from agentcache.workloads import FAMILIES, HELD_OUT_FAMILIES, generate
from agentcache.workloads.common import GenConfig


def configure(p: argparse.ArgumentParser) -> None:
    d = GenConfig()
    p.description = "Generate a workflow trace (trace format v1)."
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
    p.add_argument(
        "--held-out",
        action="store_true",
        help=f"the family's held-out variant: other agents, tools and durations ({', '.join(HELD_OUT_FAMILIES)})",
    )
    p.add_argument(
        "--hints",
        action="store_true",
        help="also write what the family's framework would know, when it would know it: the plan in the meta line,"
        " next and agent_done events (issue 53)",
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    check_output("-o", args.output)
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
            held_out=args.held_out,
            hints=args.hints,
        )
        trace = generate(args.family, cfg)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    write_trace(args.output, trace)
    requests = trace.requests
    console.print(
        f"wrote {args.output}: {len(requests)} requests, {len({r.workflow for r in requests})} workflows, "
        f"{sum(r.prompt_tokens for r in requests)} prompt tokens",
        markup=False,
    )
    return 0
