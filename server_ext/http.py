"""The HTTP process side of the plugin: tag intake and the control routes.

- Chat requests: the client says how many leading messages are the agent's
  fixed prompt (``fixed_messages``); this turns that into an exact token
  offset by rendering those messages (with the tools) through the same chat
  template and taking the longest common token prefix with the real prompt.
- Every generate request: tags are validated here. Bad tags are replaced by a
  marker naming the reason, so the request is served untagged and the
  scheduler counts it; good ones get the server's timestamp, which is the
  policy clock (identical on every scheduler rank).
- Every generate request: prompts the engine would crash on (an empty prompt
  in a batch, out-of-vocabulary ids, more top log-probabilities than the
  vocabulary has) are refused with a 400 that says why.
- Routes under ``/agentcache/v1``: end a workflow, statistics, health. They
  sit behind SGLang's API-key middleware like every other route. Control
  calls reach the schedulers through :class:`ControlChannel`, which matches
  each reply to its call; a ticker sends the clock to the schedulers so that
  leases run out on an idle server too.
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import json
import logging
import os
import time
import uuid
from array import array
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request
from fastapi.responses import ORJSONResponse

from agentcache.tags import (
    FIRST_CHARS,
    HEADER,
    KEY,
    MAX_ID_CHARS,
    VERSION,
    TagError,
    Tags,
    agent_of,
    find,
    parse,
    untagged_marker,
)

logger = logging.getLogger("agentcache")

CONTROL_TIMEOUT_ENV = "AGENTCACHE_CONTROL_TIMEOUT_S"
DEFAULT_CONTROL_TIMEOUT_S = 30.0

_logged_reasons: set[str] = set()


class RenderedPrefixes:
    """Rendered fixed prompts by content hash: bounded in entries and in tokens, least recently used out first.

    A prefix longer than `max_tokens_each` is never kept (rendered again each time): a client sending
    huge, ever-different system messages must not grow the HTTP process, even when the engine then
    refuses the prompt as too long.
    """

    def __init__(self, max_entries: int = 1024, max_tokens: int = 1 << 21, max_tokens_each: int = 1 << 16):
        self.max_entries, self.max_tokens, self.max_tokens_each = max_entries, max_tokens, max_tokens_each
        self._ids: OrderedDict[str, array] = OrderedDict()
        self.tokens = 0

    def get(self, key: str) -> array | None:
        ids = self._ids.get(key)
        if ids is not None:
            self._ids.move_to_end(key)
        return ids

    def put(self, key: str, ids: list[int]) -> None:
        if len(ids) > self.max_tokens_each or key in self._ids:
            return
        self._ids[key] = array("q", ids)  # 8 bytes a token, not a Python int object each
        self.tokens += len(ids)
        while len(self._ids) > self.max_entries or self.tokens > self.max_tokens:
            _, old = self._ids.popitem(last=False)
            self.tokens -= len(old)

    def __len__(self) -> int:
        return len(self._ids)


_prefixes = RenderedPrefixes()


# ---------------------------------------------------------------- tag intake


def _common_prefix(a: Any, b: Any) -> int:
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
    prefix: Any = _prefixes.get(key)
    if prefix is None:
        # _process_messages mutates its argument: render a copy.
        head = request.model_copy(update={"messages": copy.deepcopy(request.messages[:n])}, deep=True)
        prefix = serving_chat._process_messages(
            head, serving_chat.tokenizer_manager.model_config.is_multimodal
        ).prompt_ids
        if not isinstance(prefix, list):
            return 0
        _prefixes.put(key, prefix)
    return _common_prefix(prefix, prompt_ids)


@dataclass
class Implicit:
    """Tags the server makes for a request that came without any (no SDK): a workflow of its own, the agent by
    the SDK's fingerprint rule, so that the policy keeps the shared prompts of untagged clients too. An
    object no client can send, handed from the chat hook to the generate hook in the request's parameters."""

    agent: str
    fixed_messages: int = 0
    fixed_tokens: int = 0


def _after_chat_conversion(result: Any, serving_chat: Any, request: Any, raw_request: Any = None) -> None:
    """AFTER hook on OpenAIServingChat._convert_to_internal_request: fixed_messages -> fixed_tokens.

    A chat request without tags gets implicit ones: its leading system messages are its fixed prompt.
    """
    adapted, _ = result
    params = adapted.sampling_params if isinstance(adapted.sampling_params, dict) else None
    raw = _tags_from(params, raw_request)
    if params is None:
        return None
    if raw is None and isinstance(params.get("custom_params"), dict | None):
        agent, fixed = agent_of([m.model_dump() for m in request.messages], request.model_dump().get("tools"))
        raw = Implicit(agent, fixed)
        params["custom_params"] = {**(params.get("custom_params") or {}), KEY: raw}
    n = (
        raw.fixed_messages
        if isinstance(raw, Implicit)
        else raw.get("fixed_messages")
        if isinstance(raw, dict)
        else None
    )
    if isinstance(n, int) and not isinstance(n, bool) and n > 0 and isinstance(adapted.input_ids, list):
        try:
            fixed = resolve_fixed_messages(serving_chat, request, adapted.input_ids, n)
        except Exception as exc:  # a template that cannot render a prefix: serve, just without the boundary
            _log_once("fixed_messages", f"agentcache: cannot render the first {n} messages ({exc}); no fixed boundary")
            return None
        if isinstance(raw, Implicit):
            raw.fixed_tokens = fixed
        else:
            raw["fixed_tokens"] = fixed
    return None


# A header that is not JSON. An object no client can send, so that the chat hook can hand it on to
# the generate hook inside the request's own parameters.
BAD_HEADER = object()


def _tags_from(params: dict | None, raw_request: Any) -> Any:
    """The tag object of a request: from the body, else from the forwarded header (proxies drop body fields)."""
    if params is None:
        return None
    custom = params.get("custom_params")
    raw = find(custom)
    if raw is None and raw_request is not None:
        header = raw_request.headers.get(HEADER)
        if header:
            try:
                raw = json.loads(header)
            except (ValueError, RecursionError):  # not JSON, or nested deeper than the decoder goes
                raw = BAD_HEADER
            params["custom_params"] = {**(custom if isinstance(custom, dict) else {}), KEY: raw}
    return raw


def _log_once(reason: str, message: str) -> None:
    if reason not in _logged_reasons:
        _logged_reasons.add(reason)
        logger.warning(message)


def accept_tags(params: dict, raw_request: Any, tokenizer: Any, text: Any, input_ids: Any) -> None:
    """Validate one request's tags in place, for the scheduler: what it finds under the key is always made
    here, never what a client sent: the accepted tags with the server's timestamp and the tenant, or
    implicit tags (a request without any), or ``{"invalid": reason, "tenant": ...}``."""
    raw = _tags_from(params, raw_request)
    tenant = tenant_of_request(raw_request)
    if raw is None:  # /generate without tags: the agent by the head of its prompt, no fixed boundary
        custom = params.get("custom_params")
        if custom is not None and not isinstance(custom, dict):
            return  # served as it is, untagged: nowhere to put tags
        head = text[:FIRST_CHARS] if isinstance(text, str) else json.dumps(input_ids[:64] if input_ids else [])
        raw = Implicit(agent_of([{"role": "user", "content": head}])[0])
        custom = params["custom_params"] = {**(custom or {}), KEY: raw}
    custom = params["custom_params"]
    if isinstance(raw, Implicit):
        implicit = Tags(workflow=f"~{uuid.uuid4().hex}", agent=raw.agent, fixed_tokens=raw.fixed_tokens or None)
        custom[KEY] = implicit.replace(tenant=tenant, ts=time.time(), implicit=True).to_stamped()
        return
    try:
        if raw is BAD_HEADER:
            raise TagError("bad_header", f"the {HEADER} header is not JSON")
        tags = parse(raw)
        if tags.fixed_chars is not None and isinstance(text, str) and tokenizer is not None:
            prefix = tokenizer.encode(text[: tags.fixed_chars])
            tags = tags.replace(fixed_tokens=_common_prefix(prefix, tokenizer.encode(text)))
        if tags.fixed_tokens is not None and isinstance(input_ids, list) and tags.fixed_tokens > len(input_ids):
            raise TagError(
                "bad_fixed_tokens", f"fixed_tokens {tags.fixed_tokens} exceeds the prompt's {len(input_ids)} tokens"
            )
    except TagError as exc:
        _log_once(exc.reason, f"agentcache: request served untagged: {exc} (logged once per kind)")
        custom[KEY] = untagged_marker(tenant, exc.reason)
        return
    custom[KEY] = tags.replace(tenant=tenant, ts=time.time()).to_stamped()  # never the client's tenant


# ---------------------------------------------------------------- prompts the engine would crash on
#
# SGLang 0.5.23 lets these through to the scheduler, whose forward pass then raises, and a scheduler
# that raises takes every process of the server down with it. Refused here with a ValueError, which
# SGLang answers with HTTP 400 and the message.


def check_token_ids(input_ids: Any, vocab_size: int, where: str = "input_ids") -> None:
    """Refuse ids the model cannot embed (out of the vocabulary, or not integers)."""
    if not isinstance(input_ids, list) or not input_ids or not vocab_size:
        return
    if not all(isinstance(t, int) and not isinstance(t, bool) for t in input_ids):
        raise ValueError(f"{where} must be a list of integers")
    low, high = min(input_ids), max(input_ids)
    if low < 0 or high >= vocab_size:
        bad = low if low < 0 else high
        raise ValueError(f"{where} contains out-of-vocabulary token id {bad}; valid range is [0, {vocab_size})")


def check_request(obj: Any, vocab_size: int) -> None:
    """Refuse a generate request whose prompts or log-probability asks would crash the scheduler."""
    ids = obj.input_ids
    if isinstance(ids, list) and ids and isinstance(ids[0], list):  # a batch of prompts
        for i, prompt in enumerate(ids):
            if not prompt:
                # A prefill batch of nothing but empty prompts is a tensor of 0 elements the model cannot reshape.
                raise ValueError(f"input_ids[{i}] is empty: every prompt of a batch needs at least one token")
            check_token_ids(prompt, vocab_size, f"input_ids[{i}]")
    else:
        check_token_ids(ids, vocab_size)
    counts = obj.top_logprobs_num if isinstance(obj.top_logprobs_num, list) else [obj.top_logprobs_num]
    for n in counts:
        if isinstance(n, int) and vocab_size and n > vocab_size:
            raise ValueError(f"top_logprobs_num {n} exceeds the vocabulary's {vocab_size} tokens")


def _before_validate(tokenizer_manager: Any, obj: Any, input_ids: Any, *args: Any, **kwargs: Any) -> None:
    """BEFORE hook on TokenizerManager._validate_one_request: each prompt, as the engine will see it.

    Text can tokenize to nothing (an empty string, with a tokenizer that adds no BOS token).
    """
    session = getattr(obj, "session_params", None)
    if isinstance(input_ids, list) and not input_ids and not (isinstance(session, dict) and session.get("id")):
        raise ValueError("the prompt is empty: it has no tokens once tokenized")
    return None


def _before_generate(tokenizer_manager: Any, obj: Any, request: Any = None) -> None:
    """BEFORE hook on TokenizerManager.generate_request: every generate and chat request passes here."""
    vocab_size = getattr(getattr(tokenizer_manager, "model_config", None), "vocab_size", 0)
    check_request(obj, vocab_size)
    batch = obj.sampling_params if isinstance(obj.sampling_params, list) else [obj.sampling_params]
    texts = obj.text if isinstance(obj.text, list) else [obj.text] * len(batch)
    ids = (
        obj.input_ids
        if isinstance(obj.input_ids, list) and obj.input_ids and isinstance(obj.input_ids[0], list)
        else [obj.input_ids] * len(batch)
    )
    expiry_ticker.start()
    for params, text, input_ids in zip(batch, texts, ids):
        if isinstance(params, dict):
            try:
                accept_tags(params, request, getattr(tokenizer_manager, "tokenizer", None), text, input_ids)
            except Exception:  # never let tag handling take a request down
                logger.exception("agentcache: tag intake failed; request served untagged")
                if isinstance(params.get("custom_params"), dict):
                    params["custom_params"][KEY] = untagged_marker("", "internal_error")
    return None


# ---------------------------------------------------------------- control routes


class ControlError(RuntimeError):
    """A control call that got no (good) answer: the scheduler timed out, or said what went wrong."""

    def __init__(self, message: str, reason: str = "error"):
        super().__init__(message)
        self.reason = reason  # "timeout", "not_enabled" (no agentcache cache in the scheduler), or "error"


@dataclass
class _Call:
    done: asyncio.Future
    expected: int
    replies: list[Any] = field(default_factory=list)


class ControlChannel:
    """Control calls to every scheduler over SGLang's own channel, each reply matched to its call by id.

    A call that times out is forgotten, so its reply, should the scheduler send it later, is dropped
    (and counted) instead of answering whoever calls next: no caller can receive another's answer.
    Calls may be in flight together; each collects one reply per data-parallel group.
    """

    def __init__(self, send: Callable[[Any], None], fan_out: int):
        self._send = send
        self._fan_out = fan_out
        self._calls: dict[str, _Call] = {}
        self.late_replies = 0

    async def call(self, op: str, payload: dict[str, Any], timeout_s: float) -> list[dict[str, Any]]:
        from agentcache.server_ext.ipc import AgentCacheControl

        rid = f"agentcache-{uuid.uuid4().hex}"
        call = self._calls[rid] = _Call(asyncio.get_running_loop().create_future(), self._fan_out)
        try:
            self._send(AgentCacheControl(rid=rid, op=op, payload=json.dumps(payload)))
            outs = await asyncio.wait_for(call.done, timeout_s)
        except TimeoutError:
            raise ControlError(f"the scheduler did not answer within {timeout_s:.0f} s", "timeout") from None
        finally:
            del self._calls[rid]
        replies = [json.loads(o.result) for o in outs]
        for out, reply in zip(outs, replies):
            if not out.ok:
                raise ControlError(reply.get("error", "control operation failed"), reply.get("reason", "error"))
        return replies

    def on_reply(self, out: Any) -> None:
        call = self._calls.get(out.rid)
        if call is None or call.done.done():
            self.late_replies += 1  # its caller gave up: the answer is nobody else's
            return
        call.replies.append(out)
        if len(call.replies) == call.expected:
            call.done.set_result(call.replies)


def control_timeout_s() -> float:
    raw = os.environ.get(CONTROL_TIMEOUT_ENV)
    try:
        return float(raw) if raw else DEFAULT_CONTROL_TIMEOUT_S
    except ValueError:
        return DEFAULT_CONTROL_TIMEOUT_S


def control_channel() -> ControlChannel:
    """The HTTP process's channel to its schedulers, made on first use (the tokenizer manager exists by then)."""
    from sglang.srt.entrypoints import http_server
    from sglang.srt.runtime_context import get_parallel
    from sglang.utils import TypeBasedDispatcher

    from agentcache.server_ext.ipc import AgentCacheControlOutput

    tm = http_server.get_global_state().tokenizer_manager
    channel = getattr(tm, "_agentcache_channel", None)
    if channel is None:
        channel = ControlChannel(tm._dispatch_to_scheduler, get_parallel().num_dp_ranks)
        tm._result_dispatcher += TypeBasedDispatcher([(AgentCacheControlOutput, channel.on_reply)])
        tm._agentcache_channel = channel
    tm.auto_create_handle_loop()
    return channel


async def control(op: str, payload: dict[str, Any]) -> list[dict[str, Any]]:
    """Send one control operation to every scheduler; the replies of each data-parallel rank zero."""
    return await control_channel().call(op, payload, control_timeout_s())


class ExpiryTicker:
    """Sends the HTTP process's clock to the schedulers now and then, so leases run out on an idle server.

    Leases are checked against the policy clock, which moves with tagged requests; without ticks a
    workflow nobody ended would stay active until the next tagged request. The tick is a control
    message, so every tensor-parallel rank applies it at the same point of its request stream.
    Started by the first generate or control request (in the event loop); stops for good when the
    schedulers do not run the agentcache cache.
    """

    def __init__(self) -> None:
        self._task: asyncio.Task | None = None
        self.stopped = False

    @staticmethod
    def interval_s() -> float:
        from agentcache.server_ext.config import DEFAULT_LEASE_S, LEASE_ENV

        try:
            lease = float(os.environ.get(LEASE_ENV) or DEFAULT_LEASE_S)
        except ValueError:
            lease = DEFAULT_LEASE_S
        return min(max(lease / 4.0, 0.5), 30.0)

    def start(self) -> None:
        if self._task is not None or self.stopped:
            return
        try:
            self._task = asyncio.get_running_loop().create_task(self._run())
        except RuntimeError:  # no event loop here (never the case in the HTTP process)
            return

    async def _run(self) -> None:
        interval = self.interval_s()
        while True:
            await asyncio.sleep(interval)
            try:
                await control("expire", {"ts": time.time()})
            except ControlError as exc:
                if exc.reason == "not_enabled":  # a server without the agentcache cache: nothing to expire
                    self.stopped = True
                    return
            except Exception:  # the ticker must never die of a transient fault
                logger.exception("agentcache: lease tick failed")


expiry_ticker = ExpiryTicker()


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
    sub = (headers.get(TENANT_HEADER) or headers.get(ROUTED_TENANT_HEADER) or "")[:MAX_ID_CHARS]
    if not key and not sub:
        return ""
    digest = hashlib.sha256(key.encode()).hexdigest()[:12] if key else ""
    return f"{digest}/{sub}"


def is_operator(request: Any) -> bool:
    """Whether a request acts for the server's operator: it presents the server's own key and names no
    sub-tenant. On a server without a key anyone is, short of naming a sub-tenant (nothing is protected)."""
    import secrets

    from sglang.srt.runtime_context import get_serving

    headers = request.headers
    if headers.get(TENANT_HEADER) or headers.get(ROUTED_TENANT_HEADER):
        return False
    serving = get_serving()
    keys = [k for k in (serving.admin_api_key, serving.api_key) if k]
    if not keys:
        return True
    auth = headers.get("authorization", "")
    presented = auth[7:] if auth[:7].lower() == "bearer " else ""
    return any(secrets.compare_digest(presented.encode(), k.encode()) for k in keys)


async def _answer(op: str, payload: dict[str, Any]) -> Any:
    """The schedulers' answer to one control operation: rank zero's, or every rank's; 503 if none came."""
    expiry_ticker.start()
    try:
        replies = await control(op, payload)
    except ControlError as exc:
        return ORJSONResponse({"error": str(exc)}, status_code=503)
    return replies[0] if len(replies) == 1 else {"ranks": replies}


def add_routes(app: Any) -> None:
    async def end_workflow(workflow_id: str, request: Request) -> Any:
        try:
            parse({"v": VERSION, "workflow": workflow_id, "agent": "-"})
        except TagError as exc:
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
        return await _answer("stats", {"tenant": tenant_of_request(request), "operator": is_operator(request)})

    async def health(request: Request) -> Any:
        answer = await _answer("ping", {})
        if isinstance(answer, ORJSONResponse):
            return answer
        ranks = answer.get("ranks", [answer])
        return {"status": "ok", "policy": ranks[0]["policy"], "schedulers": len(ranks)}

    # `path`: the server decodes the path before routing, so a workflow id with a "/" (sent as %2F) spans segments.
    app.add_api_route("/agentcache/v1/workflows/{workflow_id:path}/end", end_workflow, methods=["POST"])
    app.add_api_route("/agentcache/v1/workflows/{workflow_id:path}", workflow, methods=["GET"])
    app.add_api_route("/agentcache/v1/stats", stats, methods=["GET"])
    app.add_api_route("/agentcache/v1/health", health, methods=["GET"])
