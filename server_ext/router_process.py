"""sglang-router's own process: the command line that starts it, its entry point, and its routing-key gauge.

The router is started through :func:`run_router` (``python -m
agentcache.server_ext.router_process``): sglang-router's own launcher imports
SGLang for its debugging load balancer, 20 s on two cores, where the Rust
router alone starts in 0.2 s.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence

ASSIGNMENT_MODES = ("random", "min_load", "min_group")  # how the manual policy places a new routing key
KEYS_ACTIVE = re.compile(r'^smg_worker_routing_keys_active\{[^}]*worker="([^"]+)"[^}]*\}\s+(\S+)', re.MULTILINE)


def router_command(
    worker_urls: Sequence[str],
    *,
    host: str,
    port: int,
    metrics_port: int,
    api_key: str | None = None,
    assignment_mode: str = "min_group",
) -> list[str]:
    """The command line that starts sglang-router in front of `worker_urls` with workflow pinning."""
    cmd = [
        sys.executable,
        "-m",
        "agentcache.server_ext.router_process",
        "--host",
        host,
        "--port",
        str(port),
        "--worker-urls",
        *worker_urls,
        "--policy",
        "manual",
        "--assignment-mode",
        assignment_mode,
        "--prometheus-host",
        host,
        "--prometheus-port",
        str(metrics_port),
        "--log-level",
        "warn",
    ]
    if api_key:
        cmd += ["--api-key", api_key]  # the router checks it and also sends it to the workers
    return cmd


def routing_keys_active(metrics: str) -> dict[str, float]:
    """Per worker URL, the routing keys with a request in flight, from the router's Prometheus text."""
    return {url: float(value) for url, value in KEYS_ACTIVE.findall(metrics)}


def run_router(argv: Sequence[str]) -> None:
    """sglang-router's launch_router, without importing SGLang: same flags, Rust router only."""
    from sglang_router.router import Router
    from sglang_router.router_args import RouterArgs

    parser = argparse.ArgumentParser(prog="python -m agentcache.server_ext.router_process")
    RouterArgs.add_cli_args(parser, use_router_prefix=False)
    args = RouterArgs.from_cli_args(parser.parse_args(argv), use_router_prefix=False)
    args._validate_router_args()
    Router.from_args(args).start()


if __name__ == "__main__":
    run_router(sys.argv[1:])
