"""`agentcache serve`: SGLang with the agentcache plugin, or N workers behind sglang-router (--workers)."""

from __future__ import annotations

import argparse

from agentcache.cli.common import DEFAULT_PREDICTOR, UsageError, check_server_flags
from agentcache.server_ext.model import SIZES


def configure(p: argparse.ArgumentParser) -> None:
    p.description = "Start SGLang 0.5.23 with the agentcache plugin. Extra SGLang flags go after `--`."
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
    p.add_argument(
        "--lease",
        type=float,
        help="seconds a workflow may go with no request in flight or arriving before it is retired",
    )
    p.add_argument("--call-graph", help="JSON file with the static call graph (for kvflow)")
    p.add_argument(
        "--predictor", help=f"pbkv's forecaster: markov, markov-n:N, neural:MODEL.pt (default {DEFAULT_PREDICTOR})"
    )
    p.add_argument(
        "--api-key", help="the operator's API key, which the server requires (also on the agentcache routes)"
    )
    p.add_argument(
        "--api-keys-file",
        help="a key per tenant, `name: key` a line (`operator: KEY` is the operator's, or --api-key): a tenant's key"
        " reaches its own workflows and statistics only (docs/design/wire-format.md, Tenants)",
    )
    p.add_argument(
        "--salt-per-tenant",
        action="store_true",
        help="each tenant's prompts in a prefix cache of its own: no tenant's cached_tokens tell of another's prompts",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=1,
        help="N workers behind sglang-router (manual policy, one routing slot per worker) and our front on --port; "
        "agentcache_sdk routes each request workflow-aware by default (AGENTCACHE_ROUTING=workflow-affinity: each "
        "workflow on one); other clients' sessions (session_id, X-Dynamo-Session-ID, X-Session-ID, ...) each on one",
    )
    p.add_argument("sglang_args", nargs=argparse.REMAINDER, help="-- then extra SGLang flags")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from agentcache.server_ext.config import DEFAULT_LEASE_S, ConfigError, PluginConfig, SettingNames
    from agentcache.server_ext.launcher import ServeOptions, serve_forever

    check_server_flags(args.port, args.max_total_tokens, "--max-total-tokens")
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
    if args.api_keys_file:
        from agentcache.server_ext.tenancy import checked_operator_key, load_keys

        if args.workers > 1:
            raise UsageError("--api-keys-file serves one worker: sglang-router checks one key (--workers 1)")
        try:
            checked_operator_key(load_keys(args.api_keys_file, "--api-keys-file"), args.api_key)
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
        api_keys_file=args.api_keys_file,
        salt_per_tenant=args.salt_per_tenant,
        extra_args=extra,
    )
    if args.workers < 1:
        raise UsageError(f"--workers must be >= 1, got {args.workers}")
    if args.workers > 1:
        from agentcache.server_ext.router import serve_cluster_forever

        return serve_cluster_forever(opts, args.workers, port=args.port)
    return serve_forever(opts)
