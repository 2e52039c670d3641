"""What every example shares: the bundled server when none is given, and the `--json` summary line.

Run an example with `--base-url` to use a running server; without it, the
example starts the bundled one (CPU dev mode on a machine without a GPU)
and stops it when done.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import tempfile
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import agentcache_sdk as ac


def parse_args(description: str, workflows: int = 6) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--base-url", help="agentcache server (default: start the bundled one)")
    p.add_argument("--api-key", default=None, help="the server's API key, if it needs one")
    p.add_argument("--workflows", type=int, default=workflows, help="app runs, each one workflow (default %(default)s)")
    p.add_argument("--concurrency", type=int, default=3, help="runs in flight at once (default %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="decides the loops and branches (the model is random)")
    p.add_argument("--no-agentcache", action="store_true", help="run the app without the decorator")
    p.add_argument("--model-size", default="tiny", help="bundled server's random-weight model (default %(default)s)")
    p.add_argument("--port", type=int, default=30200, help="bundled server's port (default %(default)s)")
    p.add_argument(
        "--json",
        action="store_true",
        help="end with one JSON line: workflows, requests, prompt_tokens, cached_tokens, tool_calls, tool_events",
    )
    p.add_argument(
        "--record", metavar="TRACE.jsonl", help="record the app's LLM traffic as a trace for agentcache replay"
    )
    return p.parse_args()


@contextlib.contextmanager
def server(args: argparse.Namespace) -> Iterator[str]:
    """The OpenAI base URL (…/v1) to point the app at."""
    if args.base_url:
        base = args.base_url.rstrip("/").removesuffix("/v1")
        ac.configure(base_url=base, api_key=args.api_key)
        with _recording(args):
            yield f"{base}/v1"
        return
    from agentcache.server_ext.launcher import ServeOptions, Server

    log = os.path.join(tempfile.gettempdir(), f"agentcache-example-server-{args.port}.log")
    print(f"starting the bundled server ({args.model_size} model) on port {args.port}; log: {log}", file=sys.stderr)
    with Server(ServeOptions(model_size=args.model_size, port=args.port, max_total_tokens=8000, log_path=log)) as srv:
        ac.configure(base_url=srv.base_url)
        with _recording(args):
            yield f"{srv.base_url}/v1"


def _recording(args: argparse.Namespace) -> contextlib.AbstractContextManager:
    return ac.record(args.record) if args.record else contextlib.nullcontext()


async def run_workflows(
    args: argparse.Namespace, solve: Callable[[int], Awaitable[None]], workflow: Callable[..., Any], name: str
) -> dict[str, dict[str, int]]:
    """Run `solve(0..N-1)`, `--concurrency` at a time, each call one workflow (unless --no-agentcache).

    Returns the agents each workflow's requests came from, by the SDK's count.
    """
    per_workflow: dict[str, dict[str, int]] = {}

    async def one(i: int) -> None:
        await solve(i)
        if (ctx := ac.current_workflow()) is not None:
            per_workflow[ctx.id] = dict(ctx.agents)

    run = one if args.no_agentcache else workflow(name=name)(one)
    limit = asyncio.Semaphore(args.concurrency)

    async def bounded(i: int) -> None:
        async with limit:
            await run(i)

    await asyncio.gather(*(bounded(i) for i in range(args.workflows)))
    return per_workflow


def report(args: argparse.Namespace, per_workflow: dict[str, dict[str, int]], tool_calls: int = 0) -> None:
    """Print the summary; `tool_calls`: the tools the app ran. `tool_events`: what the SDK sent the server."""
    ac.flush(30)  # end and tool events go out in the background
    usage, sdk = ac.usage(), ac.stats()
    summary = {
        "workflows": len(per_workflow),
        "requests": usage["requests"],
        "prompt_tokens": usage["prompt_tokens"],
        "cached_tokens": usage["cached_tokens"],
        "tool_calls": tool_calls,
        "tool_events": {key: sdk[key] for key in ("sent_events", "dropped_events", "refused_events")},
        "per_workflow": per_workflow,
    }
    rate = summary["cached_tokens"] / summary["prompt_tokens"] if summary["prompt_tokens"] else 0.0
    print(
        f"{summary['workflows']} workflows, {summary['requests']} requests, {tool_calls} tool calls,"
        f" {rate:.1%} of prompt tokens from cache",
        file=sys.stderr,
    )
    if args.json:
        print(json.dumps(summary))
