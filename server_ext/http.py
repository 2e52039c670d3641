"""The HTTP process side of the plugin: tag intake and the control routes.

- Chat requests: the client says how many leading messages are the agent's
  fixed prompt (``fixed_messages``); this turns that into an exact token
  offset by rendering those messages (with the tools) through the same chat
  template and taking the longest common token prefix with the real prompt.
- Every generate request: tags are validated here. Bad tags are replaced by a
  marker naming the reason, so the request is served untagged and the
  scheduler counts it; good ones get the server's timestamp, which is the
  policy clock (identical on every scheduler rank).
- Routes under ``/agentcache/v1``: end a workflow, statistics, health. They
  sit behind SGLang's API-key middleware like every other route.
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import json
import logging
import time
from collections import OrderedDict
from typing import Any

from fastapi import Request
from fastapi.responses import ORJSONResponse

from agentcache import wire

logger = logging.getLogger("agentcache")

PREFIX_CACHE_SIZE = 1024
RPC_TIMEOUT_S = 30.0

_prefix_ids: OrderedDict[str, list[int]] = OrderedDict()  # rendered fixed prefixes, by content hash
_logged_reasons: set[str] = set()


# ---------------------------------------------------------------- tag intake


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def resolve_fixed_messages(serving_chat: Any, request: Any, prompt_ids: list[int], n: int) -> int:
    """Token offset where the first `n` messages (and the tools) end inside `prompt_ids`."""
    if n <= 0 or n > len(request.messages):
        return 0
    key = hashlib.sha256(
        json.dumps(
            [request.model_dump(include={"tools"}), [m.model_dump() for m in request.messages[:n]]],
            sort_keys=True,
            default=str,
        ).encode()
    ).hexdigest()
    prefix = _prefix_ids.get(key)
    if prefix is None:
        # _process_messages mutates its argument: render a copy.
        head = request.model_copy(update={"messages": copy.deepcopy(request.messages[:n])}, deep=True)
        rendered = serving_chat._process_messages(
            head, serving_chat.tokenizer_manager.model_config.is_multimodal
        ).prompt_ids
        if not isinstance(rendered, list):
            return 0
        prefix = rendered
        _prefix_ids[key] = prefix
        if len(_prefix_ids) > PREFIX_CACHE_SIZE:
            _prefix_ids.popitem(last=False)
    else:
        _prefix_ids.move_to_end(key)
    return _common_prefix(prefix, prompt_ids)


def _after_chat_conversion(result: Any, serving_chat: Any, request: Any, raw_request: Any = None) -> None:
    """AFTER hook on OpenAIServingChat._convert_to_internal_request: fixed_messages -> fixed_tokens."""
    adapted, _ = result
    params = adapted.sampling_params if isinstance(adapted.sampling_params, dict) else None
    raw = _tags_from(params, raw_request)
    if params is None or not isinstance(raw, dict):
        return None
    n = raw.get("fixed_messages")
    if isinstance(n, int) and not isinstance(n, bool) and isinstance(adapted.input_ids, list):
        try:
            raw["fixed_tokens"] = resolve_fixed_messages(serving_chat, request, adapted.input_ids, n)
        except Exception as exc:  # a template that cannot render a prefix: serve, just without the boundary
            _log_once("fixed_messages", f"agentcache: cannot render the first {n} messages ({exc}); no fixed boundary")
    return None


def _tags_from(params: dict | None, raw_request: Any) -> Any:
    """The tag object of a request: from the body, else from the forwarded header (proxies drop body fields)."""
    if params is None:
        return None
    custom = params.get("custom_params")
    raw = wire.find(custom)
    if raw is None and raw_request is not None:
        header = raw_request.headers.get(wire.HEADER)
        if header:
            try:
                raw = json.loads(header)
            except ValueError:
                raw = {"invalid": "bad_header"}
            params["custom_params"] = {**(custom if isinstance(custom, dict) else {}), wire.KEY: raw}
    return raw


def _log_once(reason: str, message: str) -> None:
    if reason not in _logged_reasons:
        _logged_reasons.add(reason)
        logger.warning(message)


def accept_tags(params: dict, raw_request: Any, tokenizer: Any, text: Any, input_ids: Any) -> None:
    """Validate one request's tags in place; bad tags become {"invalid": reason}."""
    raw = _tags_from(params, raw_request)
    if raw is None:
        return
    custom = params["custom_params"]
    if isinstance(raw, dict) and "invalid" in raw and len(raw) == 1:
        return
    try:
        tags = wire.parse(raw)
        if tags.fixed_chars is not None and isinstance(text, str) and tokenizer is not None:
            prefix = tokenizer.encode(text[: tags.fixed_chars])
            tags = tags._replace(fixed_tokens=_common_prefix(prefix, tokenizer.encode(text)))
        if tags.fixed_tokens is not None and isinstance(input_ids, list) and tags.fixed_tokens > len(input_ids):
            raise wire.TagError(
                "bad_fixed_tokens", f"fixed_tokens {tags.fixed_tokens} exceeds the prompt's {len(input_ids)} tokens"
            )
    except wire.TagError as exc:
        _log_once(exc.reason, f"agentcache: request served untagged: {exc} (logged once per kind)")
        custom[wire.KEY] = {"invalid": exc.reason}
        return
    accepted = tags.to_wire()
    accepted["ts"] = time.time()
    accepted["tenant"] = tenant_of_request(raw_request)  # set here, never taken from the client
    custom[wire.KEY] = accepted


def check_token_ids(input_ids: Any, vocab_size: int) -> None:
    """Refuse token ids the model cannot embed: SGLang 0.5.23 lets them through and its scheduler dies on them."""
    if not isinstance(input_ids, list) or not input_ids or not vocab_size:
        return
    if not all(isinstance(t, int) and not isinstance(t, bool) for t in input_ids):
        raise ValueError("input_ids must be a list of integers")
    low, high = min(input_ids), max(input_ids)
    if low < 0 or high >= vocab_size:
        bad = low if low < 0 else high
        raise ValueError(f"input_ids contains out-of-vocabulary token id {bad}; valid range is [0, {vocab_size})")


def _before_generate(tokenizer_manager: Any, obj: Any, request: Any = None) -> None:
    """BEFORE hook on TokenizerManager.generate_request: every generate and chat request passes here."""
    batch = obj.sampling_params if isinstance(obj.sampling_params, list) else [obj.sampling_params]
    texts = obj.text if isinstance(obj.text, list) else [obj.text] * len(batch)
    ids = (
        obj.input_ids
        if isinstance(obj.input_ids, list) and obj.input_ids and isinstance(obj.input_ids[0], list)
        else [obj.input_ids] * len(batch)
    )
    vocab_size = getattr(getattr(tokenizer_manager, "model_config", None), "vocab_size", 0)
    for input_ids in ids:
        check_token_ids(input_ids, vocab_size)
    for params, text, input_ids in zip(batch, texts, ids):
        if isinstance(params, dict):
            try:
                accept_tags(params, request, getattr(tokenizer_manager, "tokenizer", None), text, input_ids)
            except Exception:  # never let tag handling take a request down
                logger.exception("agentcache: tag intake failed; request served untagged")
                if isinstance(params.get("custom_params"), dict):
                    params["custom_params"][wire.KEY] = {"invalid": "internal_error"}
    return None


# ---------------------------------------------------------------- control routes


async def control(op: str, payload: dict[str, Any]) -> list[dict[str, Any]]:
    """Send one control operation to every scheduler; the replies of each data-parallel rank zero."""
    from sglang.srt.entrypoints import http_server
    from sglang.srt.managers.communicator import FanOutCommunicator
    from sglang.srt.runtime_context import get_parallel
    from sglang.utils import TypeBasedDispatcher

    from agentcache.server_ext.ipc import AgentCacheControl, AgentCacheControlOutput

    tm = http_server.get_global_state().tokenizer_manager
    comm = getattr(tm, "_agentcache_comm", None)
    if comm is None:
        comm = FanOutCommunicator(tm._dispatch_to_scheduler, get_parallel().num_dp_ranks)
        tm._result_dispatcher += TypeBasedDispatcher([(AgentCacheControlOutput, comm.handle_recv)])
        tm._agentcache_comm = comm
    tm.auto_create_handle_loop()
    outs = await asyncio.wait_for(
        comm.queueing_call(AgentCacheControl(op=op, payload=json.dumps(payload))), RPC_TIMEOUT_S
    )
    replies = [json.loads(o.result) for o in outs]
    for out, reply in zip(outs, replies):
        if not out.ok:
            raise RuntimeError(reply.get("error", "control operation failed"))
    return replies


TENANT_HEADER = "x-agentcache-tenant"
# The same, under a name sglang-router forwards (it passes x-request-id-* and drops other headers).
ROUTED_TENANT_HEADER = "x-request-id-agentcache-tenant"


def tenant_of_request(request: Any) -> str:
    """The tenant a request acts for: workflow ids are scoped per tenant.

    It is a digest of the bearer key the client presents (so a tenant with its
    own key cannot be impersonated without that key), followed by the
    `x-agentcache-tenant` header (or `x-request-id-agentcache-tenant`, which
    sglang-router forwards) when present (sub-tenants of one shared key:
    the server's --api-key vouches for whoever holds it). No key, no header:
    the anonymous tenant "".
    """
    if request is None:
        return ""
    headers = request.headers
    auth = headers.get("authorization", "")
    key = auth[7:] if auth[:7].lower() == "bearer " else ""
    sub = (headers.get(TENANT_HEADER) or headers.get(ROUTED_TENANT_HEADER) or "")[: wire.MAX_ID_CHARS]
    if not key and not sub:
        return ""
    digest = hashlib.sha256(key.encode()).hexdigest()[:12] if key else ""
    return f"{digest}/{sub}"


async def _answer(op: str, payload: dict[str, Any]) -> Any:
    """The schedulers' answer to one control operation: rank zero's, or every rank's; 503 if none came."""
    try:
        replies = await control(op, payload)
    except (TimeoutError, RuntimeError) as exc:
        return ORJSONResponse({"error": str(exc) or "the scheduler did not answer"}, status_code=503)
    return replies[0] if len(replies) == 1 else {"ranks": replies}


def add_routes(app: Any) -> None:
    async def end_workflow(workflow_id: str, request: Request) -> Any:
        try:
            wire.parse({"v": wire.VERSION, "workflow": workflow_id, "agent": "-"})
        except wire.TagError as exc:
            return ORJSONResponse({"error": str(exc)}, status_code=400)
        answer = await _answer(
            "end", {"workflow": workflow_id, "tenant": tenant_of_request(request), "ts": time.time()}
        )
        if isinstance(answer, ORJSONResponse):
            return answer
        ranks = answer.get("ranks", [answer])
        return {"workflow": workflow_id, "ended": any(r["ended"] for r in ranks)}

    async def workflow(workflow_id: str, request: Request) -> Any:
        return await _answer("workflow", {"workflow": workflow_id, "tenant": tenant_of_request(request)})

    async def stats(request: Request) -> Any:
        return await _answer("stats", {"tenant": tenant_of_request(request)})

    async def health(request: Request) -> Any:
        answer = await _answer("ping", {})
        if isinstance(answer, ORJSONResponse):
            return answer
        ranks = answer.get("ranks", [answer])
        return {"status": "ok", "policy": ranks[0]["policy"], "schedulers": len(ranks)}

    app.add_api_route("/agentcache/v1/workflows/{workflow_id}/end", end_workflow, methods=["POST"])
    app.add_api_route("/agentcache/v1/workflows/{workflow_id}", workflow, methods=["GET"])
    app.add_api_route("/agentcache/v1/stats", stats, methods=["GET"])
    app.add_api_route("/agentcache/v1/health", health, methods=["GET"])
