"""Tag intake in the HTTP process: the client's tags in, one :class:`~agentcache.tags.Stamped` out per prompt.

Three SGLang hooks see a request, and what the scheduler finds under the
``agentcache`` key of its ``custom_params`` is always made here, never what a
client sent:

- chat requests (:func:`after_chat_conversion`): the client says how many
  leading messages are the agent's fixed prompt (``fixed_messages``); this
  turns that into an exact token offset by rendering those messages (with the
  tools) through the same chat template and taking the longest common token
  prefix with the real prompt. A chat request without tags gets them from the
  session and agent forms other clients send (server_ext/client_forms.py),
  else implicit ones (its leading system messages are its fixed prompt). The
  hook hands the generate hook a ``Stamped`` object, which no client can send.
- every generate request (:func:`around_generate`), before SGLang splits it:
  each prompt of a batch gets its own params and its own tags
  (:func:`take_tags`: the one parser, agentcache.tags; the tenant; other
  clients' forms, else implicit tags by its own head), an ``n`` group one call
  id; a ``fixed_chars`` text is tokenized on a thread, never on the event loop.
  Bad tags become a refusal naming the reason, so the prompt is served untagged
  and the scheduler counts it. Once it is answered, what its forms ask for (an
  end, a tool pause, an agent done) goes to the schedulers.
- each prompt once SGLang has tokenized it (:func:`before_tokenized_object`):
  the boundary checked against, and ``fixed_chars`` resolved with, the ids
  SGLang itself tokenized it to, and the stamp made flat with the server's
  clock (the policy clock, identical on every scheduler rank). SGLang then
  copies it into every request it sends for that prompt.
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import json
import logging
import uuid
from array import array
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple

from agentcache.server_ext.client_forms import follow_ups, hinted, hints_of, send, send_later
from agentcache.server_ext.control import expiry_ticker, server_clock
from agentcache.server_ext.guards import check_request
from agentcache.server_ext.tenancy import salt_per_tenant, salt_prefix_cache, tenant_of_request
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
    """Length of the longest common prefix of two id sequences, compared a block at a time (prompts run long)."""
    a, b = list(a), list(b)
    n, i = min(len(a), len(b)), 0
    while i < n and a[i : i + 4096] == b[i : i + 4096]:
        i += 4096
    while i < n and a[i] == b[i]:
        i += 1
    return min(i, n)


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


def _within_prompt(tags: Tags, fixed_ids: Any, input_ids: Any) -> Tags:
    """`tags` with ``fixed_chars`` resolved to tokens, the longest common prefix of the fixed text's ids with the
    ids SGLang tokenized the prompt to (so the boundary is exact); TagError for a boundary past the prompt."""
    if fixed_ids is not None and isinstance(input_ids, list):
        tags = tags.replace(fixed_tokens=_common_prefix(fixed_ids, input_ids))
    if tags.fixed_tokens is not None and isinstance(input_ids, list) and tags.fixed_tokens > len(input_ids):
        raise TagError(
            "bad_fixed_tokens", f"fixed_tokens {tags.fixed_tokens} exceeds the prompt's {len(input_ids)} tokens"
        )
    return tags


class Pending(NamedTuple):
    """One prompt's intake until SGLang has tokenized it: its stamp, and for ``fixed_chars`` its fixed text, then
    that text's ids (tokenized off the event loop). A Python object under the key: no client can send one."""

    stamped: Stamped
    fixed_text: str | None = None
    fixed_ids: list[int] | None = None


# One thread tokenizes fixed texts, so that a huge one never holds the event loop (the tokenizer releases the GIL).
_tokenizing = ThreadPoolExecutor(max_workers=1, thread_name_prefix="agentcache-tokenize")


# ---------------------------------------------------------------- the hooks


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
        fixed = _fixed_tokens(serving_chat, request, adapted.input_ids, n)
        _put(params, hinted(tenant, hints_of(raw_request), agent, fixed) or _implicit(tenant, agent, fixed))
        return None
    n = obj.get("fixed_messages") if isinstance(obj, dict) else None
    fixed = _fixed_tokens(serving_chat, request, adapted.input_ids, n)  # replaces any fixed_tokens sent with it
    try:
        _put(params, Stamped(tenant, parse(obj if fixed is None else {**obj, "fixed_tokens": fixed})))
    except TagError as exc:
        _put(params, _refused(tenant, exc))
    return None


def _members(params: dict) -> int:
    """How many scheduler requests SGLang makes of one prompt: a prefill-only warm-up and n samples where it
    samples n > 1 (GenerateReqInput._handle_parallel_sampling: beam search fans out none), else one."""
    n, beams = params.get("n", 1), params.get("beam_width") or 1
    return n + 1 if isinstance(n, int) and not isinstance(n, bool) and n > 1 and beams == 1 else 1


def take_tags(params: dict, raw_request: Any, text: Any, input_ids: Any) -> Pending | None:
    """One prompt's tags, before SGLang tokenizes it: the chat hook's or the client's, with the tenant; implicit
    ones for a prompt without any, or the reason they were refused. Put under the key as a :class:`Pending`
    (returned), or nothing where custom_params is not an object."""
    custom = params.get("custom_params")
    stamped = find(custom)
    if not isinstance(stamped, Stamped):  # /generate: the chat hook did not see it
        tenant = tenant_of_request(raw_request)
        try:
            obj = _client_object(custom, raw_request)
            stamped = Stamped(tenant, parse(obj)) if obj is not None else None
        except TagError as exc:
            stamped = _refused(tenant, exc)
        if stamped is None:  # without tags: other clients' forms, the agent by the head of its prompt, no boundary
            if custom is not None and not isinstance(custom, dict):
                return None  # served as it is, untagged: nowhere to put tags
            head = text[:FIRST_CHARS] if isinstance(text, str) else json.dumps(input_ids[:64] if input_ids else [])
            agent = agent_of([{"role": "user", "content": head}])[0]
            stamped = hinted(tenant, hints_of(raw_request), agent, None) or _implicit(tenant, agent)
    members = _members(params)
    if members > 1:
        stamped = stamped._replace(call=uuid.uuid4().hex, members=members)
    tags = stamped.tags
    fixed_text = None
    if tags is not None and not tags.implicit and tags.fixed_chars is not None and isinstance(text, str):
        fixed_text = text[: tags.fixed_chars]
    pending = Pending(stamped, fixed_text)
    _put(params, pending)
    return pending


async def tokenize_fixed_text(params: dict, pending: Pending, tokenizer: Any) -> None:
    """The fixed text's ids, tokenized on the tokenizing thread, into the prompt's Pending."""
    if pending.fixed_text is not None and tokenizer is not None:
        ids = await asyncio.get_running_loop().run_in_executor(_tokenizing, tokenizer.encode, pending.fixed_text)
        _put(params, pending._replace(fixed_text=None, fixed_ids=ids))


def stamp_tokenized(params: dict, input_ids: Any) -> None:
    """One prompt's Pending replaced by the flat stamp the scheduler reads: its tags checked against the ids
    SGLang tokenized it to, stamped with the tenant and the server's clock (the policy clock, identical on every
    scheduler rank). Its custom_params are the intake's own object (:func:`_put`), shared by this prompt alone."""
    pending = find(params.get("custom_params"))
    stamped = pending.stamped
    tags = stamped.tags
    try:
        if tags is not None and not tags.implicit:
            tags = _within_prompt(tags, pending.fixed_ids, input_ids)
    except TagError as exc:
        stamped, tags = _refused(stamped.tenant, exc)._replace(call=stamped.call, members=stamped.members), None
    if tags is not None:  # never the client's tenant
        stamped = stamped._replace(tags=tags.replace(tenant=stamped.tenant, ts=server_clock()))
    params["custom_params"][KEY] = stamped.to_wire()


def _prompts(obj: Any) -> list[tuple[Any, Any, Any]]:
    """(sampling params, text, input_ids) of each prompt of a generate request. A batch's one params object is
    copied per prompt first: SGLang's normalisation would hand every prompt the same one, and with it the
    first prompt's tags."""
    texts, ids = obj.text, obj.input_ids
    batch_ids = isinstance(ids, list) and bool(ids) and isinstance(ids[0], list)
    if not isinstance(texts, list) and not batch_ids:
        return [(obj.sampling_params, texts, ids)]
    size = len(texts) if isinstance(texts, list) else len(ids)
    if isinstance(obj.sampling_params, dict):
        obj.sampling_params = [dict(obj.sampling_params) for _ in range(size)]
    params = obj.sampling_params if isinstance(obj.sampling_params, list) else [None] * size
    texts = texts if isinstance(texts, list) else [None] * size
    return list(zip(params, texts, ids if batch_ids else [None] * size))


def _unstamped(params: dict) -> None:
    logger.exception("agentcache: tag intake failed; request served untagged")
    if isinstance(params.get("custom_params"), dict):
        _put(params, Stamped("", None, "internal_error").to_wire())


def around_generate(original: Any, tokenizer_manager: Any, obj: Any, *args: Any, **kwargs: Any) -> Any:
    """AROUND hook on TokenizerManager.generate_request: every generate and chat request passes here. Guards
    and tags each prompt, then tokenizes fixed texts off the event loop before SGLang's own generator runs."""
    vocab_size = getattr(getattr(tokenizer_manager, "model_config", None), "vocab_size", 0)
    check_request(obj, vocab_size)
    expiry_ticker.start()
    request = args[0] if args else kwargs.get("request")
    if salt_per_tenant():
        salt_prefix_cache(obj, request)
    taken, stamps = [], []
    for params, text, input_ids in _prompts(obj):
        if isinstance(params, dict):
            try:
                pending = take_tags(params, request, text, input_ids)
            except Exception:  # never let tag handling take a request down
                _unstamped(params)
                continue
            if pending is not None:
                stamps.append(pending.stamped)
                if pending.fixed_text is not None:
                    taken.append((params, pending))
    after = follow_ups(hints_of(request), stamps)  # what the client's forms ask for once it is answered
    return _generate(original, tokenizer_manager, obj, args, kwargs, taken, after)


async def _generate(
    original: Any, tokenizer_manager: Any, obj: Any, args: Any, kwargs: Any, taken: list, after: list
) -> Any:
    tokenizer = getattr(tokenizer_manager, "tokenizer", None)
    for params, pending in taken:
        try:
            await tokenize_fixed_text(params, pending, tokenizer)
        except Exception:
            _unstamped(params)
    inner = original(tokenizer_manager, obj, *args, **kwargs)
    try:
        async for out in inner:
            if after and not getattr(obj, "stream", False):
                # Unstreamed, its one output is the whole answer, and SGLang takes it without closing this.
                await send(after)
                after = []
            yield out
    finally:
        await inner.aclose()
        if after:  # streamed (or failed): once the stream is done
            send_later(after)


def before_tokenized_object(
    tokenizer_manager: Any, obj: Any, input_text: Any, input_ids: Any, *args: Any, **kwargs: Any
) -> None:
    """BEFORE hook on TokenizerManager._create_tokenized_object: each prompt once, as SGLang tokenized it (an n
    group's prompt once, before SGLang copies it into a warm-up and the samples), gets its flat stamp."""
    params = getattr(obj, "sampling_params", None)
    if isinstance(params, dict) and isinstance(find(params.get("custom_params")), Pending):
        try:
            stamp_tokenized(params, input_ids)
        except Exception:
            _unstamped(params)
    return None


def _log_once(reason: str, message: str) -> None:
    if reason not in _logged_reasons:
        _logged_reasons.add(reason)
        logger.warning(message)
