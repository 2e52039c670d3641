"""Tag intake in the HTTP process: the client's tags in, one :class:`~agentcache.tags.Stamped` out per request.

Two SGLang hooks see a request, and what the scheduler finds under the
``agentcache`` key of its ``custom_params`` is always made here, never what a
client sent:

- chat requests (:func:`after_chat_conversion`): the client says how many
  leading messages are the agent's fixed prompt (``fixed_messages``); this
  turns that into an exact token offset by rendering those messages (with the
  tools) through the same chat template and taking the longest common token
  prefix with the real prompt. A chat request without tags gets implicit ones
  (its leading system messages are its fixed prompt). The hook hands the
  generate hook a ``Stamped`` object, which no client can send.
- every generate request (:func:`accept_tags`): tags are read with the one
  parser (agentcache.tags), ``fixed_chars`` resolved against the tokenized
  text, and the result stamped with the tenant and the server's clock (the
  policy clock, identical on every scheduler rank). Bad tags become a refusal
  naming the reason, so the request is served untagged and the scheduler
  counts it.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import time
import uuid
from array import array
from collections import OrderedDict
from typing import Any

from agentcache.server_ext.control import expiry_ticker
from agentcache.server_ext.guards import check_request
from agentcache.server_ext.tenancy import tenant_of_request
from agentcache.tags import FIRST_CHARS, HEADER, KEY, Stamped, TagError, Tags, agent_of, find, header_object, parse

logger = logging.getLogger("agentcache")

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


# ---------------------------------------------------------------- the boundary in tokens


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


def _fixed_tokens(serving_chat: Any, request: Any, prompt_ids: Any, n: Any) -> int | None:
    """The token offset of a chat request's first `n` messages; None where there is none to resolve."""
    if not (isinstance(n, int) and not isinstance(n, bool) and n > 0 and isinstance(prompt_ids, list)):
        return None
    try:
        return resolve_fixed_messages(serving_chat, request, prompt_ids, n)
    except Exception as exc:  # a template that cannot render a prefix: serve, just without the boundary
        _log_once("fixed_messages", f"agentcache: cannot render the first {n} messages ({exc}); no fixed boundary")
        return None


def _within_prompt(tags: Tags, tokenizer: Any, text: Any, input_ids: Any) -> Tags:
    """`tags` with ``fixed_chars`` resolved to tokens against the text; TagError for a boundary past the prompt."""
    if tags.fixed_chars is not None and isinstance(text, str) and tokenizer is not None:
        prefix = tokenizer.encode(text[: tags.fixed_chars])
        tags = tags.replace(fixed_tokens=_common_prefix(prefix, tokenizer.encode(text)))
    if tags.fixed_tokens is not None and isinstance(input_ids, list) and tags.fixed_tokens > len(input_ids):
        raise TagError(
            "bad_fixed_tokens", f"fixed_tokens {tags.fixed_tokens} exceeds the prompt's {len(input_ids)} tokens"
        )
    return tags


# ---------------------------------------------------------------- the two hooks


def _implicit(tenant: str, agent: str, fixed_tokens: int | None = None) -> Stamped:
    """Tags the server makes for a request that came without any (no SDK): a workflow of its own, ended with
    the request, the agent by the SDK's fingerprint rule, so that the policy keeps the shared prompts of
    untagged clients too."""
    tags = Tags(workflow=f"~{uuid.uuid4().hex}", agent=agent, fixed_tokens=fixed_tokens or None, tenant=tenant)
    return Stamped(tenant, tags.replace(implicit=True))


def _refused(tenant: str, exc: TagError) -> Stamped:
    _log_once(exc.reason, f"agentcache: request served untagged: {exc} (logged once per kind)")
    return Stamped(tenant, None, exc.reason)


def _client_object(custom: Any, raw_request: Any) -> Any:
    """The client's tag object: from the body, else from the forwarded header (proxies drop body fields); None
    where it sent none. TagError for a header that is not JSON."""
    found = find(custom)
    if found is None and raw_request is not None:
        header = raw_request.headers.get(HEADER)
        if header:
            found = header_object(header)
    return found


def _put(params: dict, stamped: Any) -> None:
    custom = params.get("custom_params")
    params["custom_params"] = {**(custom if isinstance(custom, dict) else {}), KEY: stamped}


def after_chat_conversion(result: Any, serving_chat: Any, request: Any, raw_request: Any = None) -> None:
    """AFTER hook on OpenAIServingChat._convert_to_internal_request: the chat request's tags, its boundary
    (``fixed_messages``) in tokens, handed to the generate hook."""
    adapted, _ = result
    params = adapted.sampling_params if isinstance(adapted.sampling_params, dict) else None
    if params is None:
        return None
    tenant = tenant_of_request(raw_request)
    try:
        obj = _client_object(params.get("custom_params"), raw_request)
    except TagError as exc:
        _put(params, _refused(tenant, exc))
        return None
    if obj is None:
        if not isinstance(params.get("custom_params"), dict | None):
            return None  # served as it is, untagged: nowhere to put tags
        agent, n = agent_of([m.model_dump() for m in request.messages], request.model_dump().get("tools"))
        _put(params, _implicit(tenant, agent, _fixed_tokens(serving_chat, request, adapted.input_ids, n)))
        return None
    n = obj.get("fixed_messages") if isinstance(obj, dict) else None
    fixed = _fixed_tokens(serving_chat, request, adapted.input_ids, n)  # replaces any fixed_tokens sent with it
    try:
        _put(params, Stamped(tenant, parse(obj if fixed is None else {**obj, "fixed_tokens": fixed})))
    except TagError as exc:
        _put(params, _refused(tenant, exc))
    return None


def accept_tags(params: dict, raw_request: Any, tokenizer: Any, text: Any, input_ids: Any) -> None:
    """One prompt's tags, for the scheduler: the chat hook's or the client's, checked against the prompt, with
    the tenant and the server's clock; implicit tags for a request without any, or the reason they were
    refused. Writes :meth:`Stamped.to_wire` under the key, or nothing where custom_params is not an object."""
    custom = params.get("custom_params")
    stamped = find(custom)
    if not isinstance(stamped, Stamped):  # /generate: the chat hook did not see it
        tenant = tenant_of_request(raw_request)
        try:
            obj = _client_object(custom, raw_request)
            stamped = Stamped(tenant, parse(obj)) if obj is not None else None
        except TagError as exc:
            stamped = _refused(tenant, exc)
        if stamped is None:  # without tags: the agent by the head of its prompt, no fixed boundary
            if custom is not None and not isinstance(custom, dict):
                return  # served as it is, untagged: nowhere to put tags
            head = text[:FIRST_CHARS] if isinstance(text, str) else json.dumps(input_ids[:64] if input_ids else [])
            stamped = _implicit(tenant, agent_of([{"role": "user", "content": head}])[0])
    tags = stamped.tags
    if tags is not None and not tags.implicit:
        try:
            tags = _within_prompt(tags, tokenizer, text, input_ids)
        except TagError as exc:
            stamped, tags = _refused(stamped.tenant, exc), None
    if tags is not None:  # never the client's tenant
        stamped = Stamped(stamped.tenant, tags.replace(tenant=stamped.tenant, ts=time.time()))
    _put(params, stamped.to_wire())


def before_generate(tokenizer_manager: Any, obj: Any, request: Any = None) -> None:
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
                    params["custom_params"][KEY] = Stamped("", None, "internal_error").to_wire()
    return None


def _log_once(reason: str, message: str) -> None:
    if reason not in _logged_reasons:
        _logged_reasons.add(reason)
        logger.warning(message)
