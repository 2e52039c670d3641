"""Entry point of the SGLang plugin (entry-point group ``sglang.srt.plugins``).

SGLang calls ``register()`` once in every process it starts. In the launcher
(which also serves HTTP) it adds the ``--agentcache-*`` flags, the tag intake
and request guard hooks (intake.py, guards.py; other clients' forms and SGLang's
``/close_session``: client_forms.py), the limits on bodies and
connections (http_limits.py) and the control routes (routes.py); in the scheduler processes it registers the ``agentcache``
radix-cache backend (cache.py) and the handlers that feed it (control.py). SGLang
swallows exceptions raised here, so failures are logged loudly instead.
"""

from __future__ import annotations

import dataclasses
import logging
import multiprocessing
import os
import socket
import time

logger = logging.getLogger("agentcache")

BACKEND = "agentcache"
FREEZE_WAIT_S = 60.0  # how long SGLang's own post-warm-up GC freeze waits for its HTTP server to listen


def register() -> None:
    try:
        from agentcache.server_ext.ipc import register_ipc_types

        register_ipc_types()
        if multiprocessing.parent_process() is None:
            _register_launcher()
        elif _is_scheduler_process():
            _register_worker()
    except Exception:
        logger.exception("agentcache: plugin registration failed")
        raise


# ---------------------------------------------------------------- launcher / HTTP process


def _add_cli_args(result, parser):  # noqa: ANN001 - AFTER hook on ServerArgs.add_cli_args
    group = parser.add_argument_group("agentcache")
    group.add_argument(
        "--agentcache-policy", default=None, help="eviction policy of --radix-cache-backend agentcache (default pbkv)"
    )
    group.add_argument(
        "--agentcache-lease",
        type=float,
        default=None,
        help="seconds a workflow may go with no request in flight or arriving before it is retired",
    )
    group.add_argument("--agentcache-call-graph", default=None, help="JSON file with the static call graph (kvflow)")
    group.add_argument(
        "--agentcache-predictor",
        default=None,
        help="pbkv's forecaster: markov, markov-n:N, neural:MODEL.pt (default: pbkv's own)",
    )
    group.add_argument(
        "--agentcache-prefetch",
        default=None,
        choices=("conservative", "off"),
        help="load predicted cache back from HiCache during decode-only steps (default conservative)",
    )
    group.add_argument(
        "--agentcache-api-keys-file",
        default=None,
        help="a key per tenant: `name: key` lines (`operator: KEY` is the operator's key, or --api-key)",
    )
    group.add_argument(
        "--agentcache-salt-per-tenant",
        action="store_true",
        default=None,
        help="each tenant's prompts in a prefix cache of its own (no tenant's cached_tokens tell of another's)",
    )
    return None


def _capture_cli_args(cls, args):  # noqa: ANN001 - BEFORE hook on ServerArgs.from_cli_args
    from agentcache.server_ext import config

    # Exported before SGLang spawns its schedulers, which inherit the environment.
    flagged = {}  # setting -> the flag that set it, for the errors
    for setting in ("policy", "lease", "call_graph", "predictor", "prefetch"):
        env = getattr(config.ENV_NAMES, setting)
        value = getattr(args, f"agentcache_{setting}", None)
        if value is not None:
            os.environ[env] = str(value)
            flagged[setting] = f"--agentcache-{setting.replace('_', '-')}"
    # Fail at start-up, in the launcher, not later in a scheduler.
    config.PluginConfig.from_env(dataclasses.replace(config.ENV_NAMES, **flagged))
    _configure_tenants(args)
    if getattr(args, "radix_cache_backend", None) == BACKEND and (getattr(args, "tokenizer_worker_num", 1) or 1) > 1:
        # Extra HTTP workers never load plugins, so tags there would go unchecked and unscoped.
        raise SystemExit(
            "agentcache: --tokenizer-worker-num > 1 is not supported with --radix-cache-backend agentcache"
        )
    if getattr(args, "radix_cache_backend", None) != BACKEND and getattr(args, "agentcache_policy", None):
        logger.warning("agentcache: --agentcache-policy has no effect without --radix-cache-backend %s", BACKEND)


def _configure_tenants(args) -> None:  # noqa: ANN001 - SGLang's parsed arguments
    """The tenant keys, read in the HTTP process (which checks them); the server's key is the operator's."""
    from agentcache.server_ext import config, tenancy

    path = getattr(args, "agentcache_api_keys_file", None) or os.environ.get(config.API_KEYS_FILE_ENV)
    if getattr(args, "agentcache_salt_per_tenant", None):
        os.environ[config.SALT_PER_TENANT_ENV] = "1"
    keys = None
    if path:
        flag = (
            "--agentcache-api-keys-file"
            if getattr(args, "agentcache_api_keys_file", None)
            else config.API_KEYS_FILE_ENV
        )
        try:
            keys = tenancy.load_keys(path, flag)
            args.api_key = tenancy.checked_operator_key(keys, getattr(args, "api_key", None))
        except config.ConfigError as exc:
            raise SystemExit(f"agentcache: {exc}") from None
    tenancy.configure_keys(keys)
    tenancy.log_mode(getattr(args, "api_key", None), keys)


def _before_http_server(*args, **kwargs):  # noqa: ANN001 - BEFORE hook on http_server._setup_and_run_http_server
    from sglang.srt.entrypoints import http_server

    from agentcache.server_ext import http_limits
    from agentcache.server_ext.routes import add_routes

    add_routes(http_server.app)
    http_limits.install(http_server.app, http_limits.HttpLimits.from_env())


def _freeze_gc_once_listening(original, server_args, *args, **kwargs):  # noqa: ANN001 - AROUND hook on
    # http_server._freeze_gc_after_server_warmup. With --skip-server-warmup (CPU dev mode) SGLang posts its own
    # /freeze_gc before uvicorn listens: the freeze never happens and a refused connection is logged with a
    # 70-line traceback at every start. Wait (bounded) until the port accepts connections, then let it run.
    deadline = time.monotonic() + FREEZE_WAIT_S
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((server_args.host, server_args.port), timeout=1.0):
                break
        except OSError:
            time.sleep(0.1)
    return original(server_args, *args, **kwargs)


def _register_launcher() -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from agentcache.server_ext import client_forms, guards, http_limits, intake, tenancy

    HookRegistry.register("sglang.srt.server_args.ServerArgs.add_cli_args", _add_cli_args, HookType.AFTER)
    HookRegistry.register("sglang.srt.server_args.ServerArgs.from_cli_args", _capture_cli_args, HookType.BEFORE)
    HookRegistry.register(
        "sglang.srt.entrypoints.http_server._setup_and_run_http_server", _before_http_server, HookType.BEFORE
    )
    HookRegistry.register(
        "sglang.srt.entrypoints.http_server._freeze_gc_after_server_warmup", _freeze_gc_once_listening, HookType.AROUND
    )
    HookRegistry.register("uvicorn.config.Config.__init__", http_limits.limit_uvicorn, HookType.BEFORE)
    # Imported by SGLang when it installs its API-key check: with tenant keys, ours decides instead.
    HookRegistry.register("sglang.srt.utils.auth.add_api_key_middleware", tenancy.add_key_middleware, HookType.AROUND)
    HookRegistry.register(
        "sglang.srt.entrypoints.openai.serving_chat.OpenAIServingChat._convert_to_internal_request",
        intake.after_chat_conversion,
        HookType.AFTER,
    )
    HookRegistry.register(
        "sglang.srt.managers.tokenizer_manager.TokenizerManager.generate_request",
        intake.around_generate,
        HookType.AROUND,
    )
    HookRegistry.register(
        "sglang.srt.managers.tokenizer_manager.TokenizerManager._create_tokenized_object",
        intake.before_tokenized_object,
        HookType.BEFORE,
    )
    HookRegistry.register(
        "sglang.srt.managers.tokenizer_manager.TokenizerManager._validate_one_request",
        guards.before_validate,
        HookType.BEFORE,
    )
    HookRegistry.register(
        "sglang.srt.managers.tokenizer_manager.TokenizerManager.close_session",
        client_forms.around_close_session,
        HookType.AROUND,
    )


# ---------------------------------------------------------------- scheduler processes


def _is_scheduler_process() -> bool:
    """Children other than the detokenizer and the data-parallel controller (both name themselves first)."""
    try:
        from setproctitle import getproctitle
    except ImportError:
        return True
    title = getproctitle()
    return "detokenizer" not in title and "data_parallel_controller" not in title


def _observe_request(req, scheduler, *args, **kwargs):  # noqa: ANN001 - AFTER hook on Scheduler._create_generation_req
    from agentcache.server_ext.cache import AgentCache

    cache = getattr(scheduler, "tree_cache", None)
    if isinstance(cache, AgentCache):
        try:
            cache.observe(req)
        except Exception:  # a tagging bug must never drop a request
            logger.exception(
                "agentcache: could not register request %s; it is served untagged", getattr(req, "rid", "?")
            )
    return None


def _report_admission(result, adder, req, *args, **kwargs):  # noqa: ANN001 - AFTER hook on PrefillAdder._commit_prefill_admission
    from agentcache.server_ext.cache import AgentCache

    cache = getattr(adder, "tree_cache", None)
    if isinstance(cache, AgentCache):
        try:
            cache.admitted(req)
        except Exception:  # bookkeeping only: never let it break admission
            logger.exception("agentcache: could not note the admission of request %s", getattr(req, "rid", "?"))
    return None


def _prefetch_when_idle(plan, scheduler, *args, **kwargs):  # noqa: ANN001 - AFTER hook on Scheduler.get_next_batch_to_run
    """Decode-only steps (or none) leave the host-to-device link idle: spend it on predicted cache."""
    from agentcache.server_ext.cache import AgentCache

    cache = getattr(scheduler, "tree_cache", None)
    batch = getattr(plan, "batch_to_run", None)
    if isinstance(cache, AgentCache) and (batch is None or batch.forward_mode.is_decode()):
        try:
            cache.prefetch_step()
        except Exception:  # a prefetch is an optimisation: never let it break serving
            logger.exception("agentcache: prefetch failed; serving continues without it")
    return None


def _install_control_handler(result, scheduler):  # noqa: ANN001 - AFTER hook on Scheduler.init_request_dispatcher
    from sglang.utils import TypeBasedDispatcher

    from agentcache.server_ext.control import handle_control
    from agentcache.server_ext.ipc import AgentCacheControl

    scheduler._request_dispatcher += TypeBasedDispatcher(
        [(AgentCacheControl, lambda req: handle_control(scheduler, req))]
    )
    return None


def _register_worker() -> None:
    from sglang.srt.mem_cache.registry import get_radix_cache_factory, register_radix_cache_backend
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from agentcache.engine.cpu_hicache import apply_cpu_hicache_shims
    from agentcache.server_ext.cache import build_agentcache

    if get_radix_cache_factory(BACKEND) is None:
        register_radix_cache_backend(BACKEND, build_agentcache)
    apply_cpu_hicache_shims()
    HookRegistry.register(
        "sglang.srt.managers.scheduler.Scheduler._create_generation_req", _observe_request, HookType.AFTER
    )
    HookRegistry.register(
        "sglang.srt.managers.scheduler.Scheduler.init_request_dispatcher", _install_control_handler, HookType.AFTER
    )
    HookRegistry.register(
        "sglang.srt.managers.scheduler.Scheduler.get_next_batch_to_run", _prefetch_when_idle, HookType.AFTER
    )
    HookRegistry.register(
        "sglang.srt.managers.schedule_policy.PrefillAdder._commit_prefill_admission",
        _report_admission,
        HookType.AFTER,
    )
