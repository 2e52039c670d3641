"""Tagging every LLM request made inside a workflow, where the frameworks send them.

LangGraph (langchain-openai), AutoGen (autogen-ext) and CrewAI all send through
the `openai` Python SDK, whose clients call ``_prepare_options`` on every
request, a hook documented for mutating options. It is private, so the
supported openai range is pinned in pyproject.toml and tested. Clients that
do not use the openai SDK are tagged one level lower, when httpx sends the
request. Only requests to the configured agentcache server are touched: no
other endpoint ever sees the extra fields.

The routing key (``x-smg-routing-key``, read by sglang-router's manual
policy) is the workflow id (percent-encoded where it is not ASCII: a header
value must be), unless the server is an agentcache cluster and the routing
is ``workflow-aware`` (the default): then httpx's send, which every request
goes through (the openai SDK's too), replaces it with the slot
agentcache_sdk._routing chooses, and hands the answer back to it. Whatever
fails inside tagging, the request goes out as the app wrote it.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

import httpx

from agentcache.tags import HEADER, KEY, MAX_ID_CHARS, TagError, Tags, agent_of, find, parse
from agentcache_sdk import _routing
from agentcache_sdk._config import settings
from agentcache_sdk._routing import Ticket
from agentcache_sdk._workflow import _warn_once, current_agent_name, current_workflow, end_observers, logger, notify

ROUTING_HEADER = "x-smg-routing-key"  # sglang-router (manual policy) pins each key to one worker
_TAGGED_PATHS = ("/chat/completions", "/generate")
_installed = False
usage_totals: dict[str, int] = {"requests": 0, "prompt_tokens": 0, "cached_tokens": 0}
_usage_lock = threading.Lock()
observers: list[Any] = []  # callables(sent_at, request_body, response_json, tags) after a tagged request (the recorder)


def tags_for(path: str, body: Mapping[str, Any]) -> Tags | None:
    """The tags of one request body inside the current workflow (None outside any, or for other routes)."""
    ctx = current_workflow()
    if ctx is None or not path.endswith(_TAGGED_PATHS):
        return None
    fixed_messages = None
    if path.endswith("/chat/completions"):
        messages = body.get("messages")
        if not isinstance(messages, list):
            return None
        agent, fixed_messages = agent_of(messages, body.get("tools"))
    else:
        text = body.get("text")
        head = text[:200] if isinstance(text, str) else str(body.get("input_ids", ""))[:200]
        agent, _ = agent_of([{"role": "user", "content": head}])
    # A framework's node or role name, as the user wrote it: cut to a valid id (a control character in it would
    # get the request's tags refused, and the request served untagged).
    name = current_agent_name()
    if name:
        name = "".join(c for c in name if c.isprintable())[:MAX_ID_CHARS] or None
    workflow_id = ctx.tag_request(name or agent)  # after an end, the call's next workflow (see _workflow)
    if workflow_id is None:
        return None
    return Tags(workflow=workflow_id, agent=agent, agent_name=name, fixed_messages=fixed_messages)


def routing_key(workflow: str) -> str:
    """The workflow's routing key: its id, percent-encoded where it is not ASCII (a workflow named in Chinese or
    Cyrillic is valid, a header value with it is not)."""
    return workflow if workflow.isascii() else quote(workflow, safe="")


def _routing_headers(tags: Tags) -> dict[str, str]:
    wire = json.dumps(tags.to_wire(), ensure_ascii=True, separators=(",", ":"))
    return {ROUTING_HEADER: routing_key(tags.workflow), HEADER: wire}


def _tags_in(body: Mapping[str, Any]) -> Any:
    """The tag object a body already carries (put there by the app, or by the openai hook), else None."""
    found = find(body.get("custom_params"))
    if found is None:
        params = body.get("sampling_params")
        found = find(params.get("custom_params")) if isinstance(params, Mapping) else None
    return found


def _with_tags(path: str, body: dict[str, Any], tags: Tags) -> dict[str, Any] | None:
    """The body with tags under custom_params (top level for OpenAI routes, sampling_params for /generate); None
    where the app's own field there is not an object (the request goes as the app wrote it, untagged: the
    server answers it as it would have)."""
    if path.endswith("/generate"):
        params = body.get("sampling_params")
        params = {} if params is None else params
        if not isinstance(params, Mapping):
            return None
        custom = _custom_params_with(params.get("custom_params"), tags)
        return None if custom is None else {**body, "sampling_params": {**params, "custom_params": custom}}
    custom = _custom_params_with(body.get("custom_params"), tags)
    return None if custom is None else {**body, "custom_params": custom}


def _custom_params_with(custom: Any, tags: Tags) -> dict[str, Any] | None:
    """An app's custom_params (None: it has none) with the tags added; None where they are not an object."""
    if custom is None:
        return {KEY: tags.to_wire()}
    return {**custom, KEY: tags.to_wire()} if isinstance(custom, Mapping) else None


# ---------------------------------------------------------------- openai SDK


def _tag_openai_options(client: Any, options: Any) -> None:
    body = options.json_data
    if not isinstance(body, Mapping) or _tags_in(body) is not None:
        return
    if not settings.targets(str(client.base_url)):
        return
    tags = tags_for(options.url, body)
    if tags is None:
        return
    extra = dict(options.extra_json) if isinstance(options.extra_json, Mapping) else {}
    custom = _custom_params_with(extra.get("custom_params") or body.get("custom_params"), tags)
    if custom is None:
        return
    extra["custom_params"] = custom
    headers = dict(options.headers) if isinstance(options.headers, Mapping) else {}
    headers.update(_routing_headers(tags))
    options.extra_json, options.headers = extra, headers  # all or nothing


def _tag_openai_options_or_leave(client: Any, options: Any) -> None:
    try:
        _tag_openai_options(client, options)
    except Exception:  # a bug of ours must not fail the app's request: it goes as the app wrote it
        _tagging_failed()


def _tagging_failed() -> None:
    logger.debug("agentcache: tagging a request failed", exc_info=True)
    _warn_once(
        "tagging_failures",
        "agentcache: tagging a request failed (a bug: please report it); the request was sent untagged, as the app"
        " wrote it; counted in agentcache_sdk.stats()['tagging_failures']",
    )


def _install_openai() -> None:
    try:
        from openai._base_client import AsyncAPIClient, SyncAPIClient
    except ImportError:
        return
    sync_original = SyncAPIClient._prepare_options
    async_original = AsyncAPIClient._prepare_options

    def _prepare_options(self: Any, options: Any) -> Any:
        options = sync_original(self, options)
        _tag_openai_options_or_leave(self, options)
        return options

    async def _prepare_options_async(self: Any, options: Any) -> Any:
        options = await async_original(self, options)
        _tag_openai_options_or_leave(self, options)
        return options

    SyncAPIClient._prepare_options = _prepare_options
    AsyncAPIClient._prepare_options = _prepare_options_async


# ---------------------------------------------------------------- httpx (any other client) and observers


Retagged = tuple[httpx.Request, "dict[str, Any] | None", "Tags | None", "Ticket | None"]


def _retag(request: httpx.Request) -> Retagged:
    """(request to send, its JSON body, its tags, its routing ticket) for a request to the agentcache server.

    The ticket, when the request was routed workflow-aware, must be handed back (`Ticket.done`) once the
    answer is in or the request failed.
    """
    if (
        request.method != "POST"
        or not settings.targets(str(request.url))
        or not request.url.path.endswith(_TAGGED_PATHS)
    ):
        return request, None, None, None
    try:
        body = json.loads(request.content or b"null")
    except (ValueError, httpx.RequestNotRead):
        return request, None, None, None
    if not isinstance(body, dict):
        return request, None, None, None
    ctx = current_workflow()
    authorization = request.headers.get("authorization")
    if ctx is not None and authorization:
        ctx.authorization = authorization
    carried = _tags_in(body)
    if carried is not None:  # tagged by the openai hook (or by the app itself): read back with the one parser
        try:
            tags = parse(carried)
        except TagError:
            return request, body, None, None
        ticket = None
        # Route the SDK's own workflows (the openai hook set the workflow id as the key); an app's own tags
        # and routing keys are left as they are.
        if (
            ctx is not None
            and ctx.id == tags.workflow
            and request.headers.get(ROUTING_HEADER) in (None, routing_key(tags.workflow))
        ):
            ticket = _routing.route(request.url.path, body, tags, authorization)
            if ticket is not None:
                request.headers[ROUTING_HEADER] = ticket.key
        return request, body, tags, ticket
    tags = tags_for(request.url.path, body)
    if tags is None:
        return request, body, None, None
    tagged_body = _with_tags(request.url.path, body, tags)
    if tagged_body is None:
        return request, body, None, None
    body = tagged_body
    headers = {k: v for k, v in request.headers.items() if k.lower() != "content-length"}
    headers.update(_routing_headers(tags))
    tagged = httpx.Request(
        request.method, request.url, headers=headers, content=json.dumps(body).encode(), extensions=request.extensions
    )
    # Routed last: a ticket is handed back only once the request was sent, so nothing may fail after it is taken.
    ticket = _routing.route(request.url.path, body, tags, authorization)
    if ticket is not None:
        tagged.headers[ROUTING_HEADER] = ticket.key
    return tagged, body, tags, ticket


def _retag_or_leave(request: httpx.Request) -> Retagged:
    try:
        return _retag(request)
    except Exception:  # a bug of ours must not fail the app's request: it goes as the app wrote it
        _tagging_failed()
        return request, None, None, None


def _observe(
    sent_at: float,
    body: dict[str, Any] | None,
    tags: Tags | None,
    ticket: Ticket | None,
    response: httpx.Response,
    data: Any,
) -> None:
    """Count the server's usage figures, hand tagged exchanges to the observers (the recorder), and the
    answer to the routing that placed the request. `data`: the answer as JSON (a streamed one as
    `StreamedAnswer` put it together)."""
    if response.status_code != 200:
        data = None
    if not isinstance(data, dict):
        if ticket is not None:
            ticket.done()
        return
    prompt, cached, completion = _count_usage(data)
    if ticket is not None:
        ticket.done(prompt, cached, completion)
    if tags is not None:
        for observer in list(observers):
            notify(observer, sent_at, body, data, tags)


def _usage_of(data: dict[str, Any]) -> tuple[int | None, int | None, int | None]:
    """(prompt tokens, cached prompt tokens, output tokens) an answer reports, None where it does not."""
    usage = data.get("usage")
    if isinstance(usage, dict):  # OpenAI routes
        details = usage.get("prompt_tokens_details")
        details = details if isinstance(details, dict) else {}
        prompt, cached, completion = (
            usage.get("prompt_tokens"),
            details.get("cached_tokens"),
            usage.get("completion_tokens"),
        )
    else:  # /generate
        meta = data.get("meta_info")
        meta = meta if isinstance(meta, dict) else {}
        prompt, cached, completion = meta.get("prompt_tokens"), meta.get("cached_tokens"), meta.get("completion_tokens")
    return _count(prompt), _count(cached), _count(completion)


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _count_usage(data: dict[str, Any]) -> tuple[int | None, int | None, int | None]:
    prompt, cached, completion = _usage_of(data)
    with _usage_lock:
        usage_totals["requests"] += 1
        usage_totals["prompt_tokens"] += prompt or 0
        usage_totals["cached_tokens"] += cached or 0
    return prompt, cached, completion


def usage() -> dict[str, int]:
    """Requests, prompt tokens and cached prompt tokens of the answers from the server so far (a streamed answer's
    tokens where the server sent its usage: OpenAI routes with `stream_options={"include_usage": True}`)."""
    with _usage_lock:
        return dict(usage_totals)


def _json(payload: bytes) -> Any:
    try:
        return json.loads(payload)
    except ValueError:
        return None


class JSONAnswer:
    """A whole answer's bytes, as they pass, then its JSON."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, chunk: bytes) -> None:
        self._buffer += chunk

    def answer(self) -> Any:
        return _json(bytes(self._buffer))


class StreamedAnswer:
    """A streamed answer read from its server-sent events as they pass, keeping only what a whole answer
    would say: the reply's text, and the usage figures the server sends (OpenAI routes: the last event, with
    `stream_options.include_usage`; /generate: every event's meta_info). `answer()` is then the JSON a
    non-streamed answer would hold, or None where no event could be read."""

    def __init__(self) -> None:
        self._partial = b""  # a line not yet complete: events may be split anywhere between chunks
        self._text: list[str] = []
        self._usage: dict[str, Any] | None = None
        self._generated: dict[str, Any] | None = None  # /generate: its latest event (the text so far)

    def feed(self, chunk: bytes) -> None:
        *lines, self._partial = (self._partial + chunk).split(b"\n")
        for line in lines:
            self._read(line.strip())

    def _read(self, line: bytes) -> None:
        if not line.startswith(b"data:"):
            return
        event = _json(line[5:].strip())  # "[DONE]" is no JSON: skipped
        if not isinstance(event, dict):
            return
        if isinstance(event.get("meta_info"), dict):
            self._generated = event
            return
        if isinstance(event.get("usage"), dict):
            self._usage = event["usage"]
        choices = event.get("choices")
        if isinstance(choices, list) and choices and isinstance(choices[0], dict):
            delta = choices[0].get("delta")
            if isinstance(delta, dict) and isinstance(delta.get("content"), str):
                self._text.append(delta["content"])

    def answer(self) -> dict[str, Any] | None:
        self.feed(b"\n")  # an event the server did not end with a newline
        if self._generated is not None:
            return self._generated
        if not self._text and self._usage is None:
            return None
        data: dict[str, Any] = {"choices": [{"message": {"role": "assistant", "content": "".join(self._text)}}]}
        if self._usage is not None:
            data["usage"] = self._usage
        return data


class _TeeStream(httpx.SyncByteStream):
    """A response body read lazily by the client (the openai SDK reads its JSON that way, and every streamed
    answer): fed to `reader` as it passes, and observed once read (or closed)."""

    def __init__(self, inner: Any, reader: JSONAnswer | StreamedAnswer, done: Any):
        self._inner, self._reader, self._done = inner, reader, done

    def __iter__(self) -> Any:
        for chunk in self._inner:
            self._reader.feed(chunk)
            yield chunk

    def close(self) -> None:
        self._inner.close()
        done, self._done = self._done, None
        if done is not None:
            done(self._reader.answer())


class _AsyncTeeStream(httpx.AsyncByteStream):
    def __init__(self, inner: Any, reader: JSONAnswer | StreamedAnswer, done: Any):
        self._inner, self._reader, self._done = inner, reader, done

    async def __aiter__(self) -> Any:
        async for chunk in self._inner:
            self._reader.feed(chunk)
            yield chunk

    async def aclose(self) -> None:
        await self._inner.aclose()
        done, self._done = self._done, None
        if done is not None:
            done(self._reader.answer())


def _reader_for(body: dict[str, Any]) -> JSONAnswer | StreamedAnswer:
    """What reads the answer to `body`: server-sent events where the request asked for a stream, else JSON."""
    return StreamedAnswer() if body.get("stream") else JSONAnswer()


def _answer_of(body: dict[str, Any], payload: bytes) -> Any:
    """A response read whole, as its reader puts it together."""
    reader = _reader_for(body)
    reader.feed(payload)
    return reader.answer()


def _install_httpx() -> None:
    sync_send = httpx.Client.send
    async_send = httpx.AsyncClient.send

    # A routed request's ticket is handed back exactly once: when its answer was read, or its stream closed
    # (streamed answers: the openai SDK closes them once read), or when sending or reading it failed.

    def send(self: httpx.Client, request: httpx.Request, **kwargs: Any) -> httpx.Response:
        request, body, tags, ticket = _retag_or_leave(request)
        sent_at = time.monotonic()
        try:
            response = sync_send(self, request, **kwargs)
            if body is not None:
                if kwargs.get("stream"):
                    response.stream = _TeeStream(
                        response.stream,
                        _reader_for(body),
                        lambda data: _observe(sent_at, body, tags, ticket, response, data),
                    )
                else:
                    _observe(sent_at, body, tags, ticket, response, _answer_of(body, response.read()))
        except BaseException:
            if ticket is not None:
                ticket.done()
            raise
        return response

    async def send_async(self: httpx.AsyncClient, request: httpx.Request, **kwargs: Any) -> httpx.Response:
        request, body, tags, ticket = _retag_or_leave(request)
        sent_at = time.monotonic()
        try:
            response = await async_send(self, request, **kwargs)
            if body is not None:
                if kwargs.get("stream"):
                    response.stream = _AsyncTeeStream(
                        response.stream,
                        _reader_for(body),
                        lambda data: _observe(sent_at, body, tags, ticket, response, data),
                    )
                else:
                    _observe(sent_at, body, tags, ticket, response, _answer_of(body, await response.aread()))
        except BaseException:
            if ticket is not None:
                ticket.done()
            raise
        return response

    httpx.Client.send = send
    httpx.AsyncClient.send = send_async


def install() -> None:
    """Install both hooks once per process (done when agentcache_sdk is imported)."""
    global _installed
    if _installed:
        return
    _installed = True
    _install_openai()
    _install_httpx()
    if _routing.forget not in end_observers:
        end_observers.append(_routing.forget)
