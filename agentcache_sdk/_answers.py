"""Reading the server's answers to tagged requests as they pass: usage figures, and the whole answer for the
observers (the recorder), for the routing that placed the request, and for the tool calls it asks for (a pause
starts: agentcache_sdk._tools)."""

from __future__ import annotations

import json
import threading
from typing import TYPE_CHECKING, Any

from agentcache.tags import Tags
from agentcache_sdk import _tools
from agentcache_sdk._counters import notify
from agentcache_sdk._routing import Ticket

if TYPE_CHECKING:
    import httpx

usage_totals: dict[str, int] = {"requests": 0, "prompt_tokens": 0, "cached_tokens": 0}
_usage_lock = threading.Lock()
observers: list[Any] = []  # callables(sent_at, request_body, response_json, tags) after a tagged request (the recorder)


def observe(
    sent_at: float,
    body: dict[str, Any] | None,
    tags: Tags | None,
    ticket: Ticket | None,
    response: httpx.Response,
    data: Any,
) -> None:
    """Count the server's usage figures, hand tagged exchanges to the observers (the recorder), the answer to the
    routing that placed the request, and its tool calls to the tool pauses. `data`: the answer as JSON (a
    streamed one as `StreamedAnswer` put it together)."""
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
        _tools.answered(tags.workflow, tags.identity, data)  # after the recorder took the request


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
    would say: the reply's text, its tool calls' ids and names and its finish reason, and the usage figures
    the server sends (OpenAI routes: the last event, with `stream_options.include_usage`; /generate: every
    event's meta_info). `answer()` is then the JSON a non-streamed answer would hold, or None where no event
    could be read."""

    def __init__(self) -> None:
        self._partial = b""  # a line not yet complete: events may be split anywhere between chunks
        self._text: list[str] = []
        self._tool_calls: dict[Any, dict[str, Any]] = {}  # by the delta's index: the call's id and name
        self._finish_reason: str | None = None
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
            if isinstance(choices[0].get("finish_reason"), str):
                self._finish_reason = choices[0]["finish_reason"]
            delta = choices[0].get("delta")
            if isinstance(delta, dict) and isinstance(delta.get("content"), str):
                self._text.append(delta["content"])
            if isinstance(delta, dict) and isinstance(delta.get("tool_calls"), list):
                self._read_tool_calls(delta["tool_calls"])

    def _read_tool_calls(self, deltas: list[Any]) -> None:
        """A call's id and name come in its first delta; its arguments, not kept, in the next ones."""
        for delta in deltas:
            if not isinstance(delta, dict):
                continue
            call = self._tool_calls.setdefault(delta.get("index", len(self._tool_calls)), {"function": {}})
            if isinstance(delta.get("id"), str):
                call["id"] = delta["id"]
            function = delta.get("function")
            if isinstance(function, dict) and function.get("name") and not call["function"].get("name"):
                call["function"]["name"] = function["name"]

    def answer(self) -> dict[str, Any] | None:
        self.feed(b"\n")  # an event the server did not end with a newline
        if self._generated is not None:
            return self._generated
        if not self._text and self._usage is None and not self._tool_calls and self._finish_reason is None:
            return None
        message: dict[str, Any] = {"role": "assistant", "content": "".join(self._text)}
        if self._tool_calls:
            message["tool_calls"] = list(self._tool_calls.values())
        data: dict[str, Any] = {"choices": [{"message": message, "finish_reason": self._finish_reason}]}
        if self._usage is not None:
            data["usage"] = self._usage
        return data


def reader_for(body: dict[str, Any]) -> JSONAnswer | StreamedAnswer:
    """What reads the answer to `body`: server-sent events where the request asked for a stream, else JSON."""
    return StreamedAnswer() if body.get("stream") else JSONAnswer()


def answer_of(body: dict[str, Any], payload: bytes) -> Any:
    """A response read whole, as its reader puts it together."""
    reader = reader_for(body)
    reader.feed(payload)
    return reader.answer()
