"""Recording a live app's LLM traffic as a workflow trace (format v1), to replay with `agentcache replay`.

    with agentcache_sdk.record("trace.jsonl"):
        run_my_app()

Every tagged chat request becomes a request event: the tool schemas and each
message are segments whose content id is a hash of their content (so the
same text in two prompts is the same segment, and an assistant reply that
comes back in a later prompt is the earlier request's output), with token
counts estimated as characters / 4 (the recorder has no tokenizer; the
estimate is the same for the same text, which is what the trace format
needs). Workflow ends become end events, the tool pauses the SDK reports
(agentcache_sdk._tools) tool_start and tool_end events, and the framework's
decisions (agentcache_sdk._plan) next and agent_done events, whether or not
they are sent to the server. The app's plan goes in the meta line, which is
written with the first event for that (a new file holds one plan: a later
one, another app's, is left out with a warning). Events are written as they happen;
a request's time is when it was sent, raised to the previous event's time
where concurrent requests finish out of order, so the file stays in time order.
"""

from __future__ import annotations

import hashlib
import json
import math
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from agentcache.tags import Tags
from agentcache.trace import (
    AgentDone,
    End,
    Event,
    Meta,
    Next,
    Request,
    Segment,
    ToolEnd,
    ToolStart,
    TraceWriter,
    plan_fields,
)
from agentcache_sdk import _answers, _plan, _tools, _workflow
from agentcache_sdk._counters import warn_once

CHARS_PER_TOKEN = 4


def _text(content: Any) -> str:
    return content if isinstance(content, str) else json.dumps(content, sort_keys=True, default=str)


def _segment(kind: str, text: str) -> Segment:
    digest = hashlib.sha256(f"{kind}\x1f{text}".encode()).hexdigest()[:20]
    return Segment(f"{kind}:{digest}", max(1, math.ceil(len(text) / CHARS_PER_TOKEN)))


def message_segment(message: Mapping[str, Any]) -> Segment:
    return _segment(str(message.get("role", "user")), _text(message.get("content")))


class Recorder:
    def __init__(self, path: str | Path, name: str = "recorded", *, append: bool = False):
        self.path = Path(path)
        self._meta = Meta(name=name, description="recorded by agentcache_sdk.record()")
        # An existing recording is refused unless `append` (appended events follow its own). A new file's writer
        # opens with the first event, so that a plan given before it goes into the meta line.
        self._writer: TraceWriter | None = TraceWriter(self.path, append=append)
        self._last_ts = self._writer.last_ts
        if not append:
            self._writer.close()
            self._writer = None
        self._plan_app: str | None = None  # the app whose plan the meta line holds
        self._lock = threading.Lock()
        self._start = time.monotonic() - self._last_ts
        self.requests = 0

    def _opened(self) -> TraceWriter:
        if self._writer is None:
            self._writer = TraceWriter(self.path, self._meta)
        return self._writer

    def _write(self, event: Event) -> None:
        self._opened().write(event)

    def _ts(self, at: float) -> float:
        ts = max(round(at - self._start, 3), self._last_ts)
        self._last_ts = ts
        return ts

    def on_request(self, sent_at: float, body: Mapping[str, Any], response: Mapping[str, Any], tags: Tags) -> None:
        messages = body.get("messages")
        if not isinstance(messages, list):
            return
        segments = []
        fixed = tags.fixed_messages or 0
        if body.get("tools"):
            segments.append(_segment("tools", _text(body["tools"])))
            fixed += 1
        segments += [message_segment(m) for m in messages if isinstance(m, Mapping)]
        choices = response.get("choices")
        first = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], Mapping) else {}
        message = first.get("message")
        reply = (message.get("content") if isinstance(message, Mapping) else None) or ""
        output = _segment("assistant", _text(reply)) if reply else None
        with self._lock:
            self._write(
                Request(
                    ts=self._ts(sent_at),
                    workflow=tags.workflow,
                    agent=tags.identity,
                    segments=tuple(segments),
                    fixed=min(fixed, len(segments)),
                    output=output.tokens if output else 1,
                    output_id=output.content_id if output else None,
                    app=tags.app,
                )
            )
            self.requests += 1

    def on_end(self, workflow: str) -> None:
        with self._lock:
            self._write(End(self._ts(time.monotonic()), workflow))

    def on_tool(self, kind: str, workflow: str, agent: str, tool: str) -> None:
        event = ToolStart if kind == ToolStart.TYPE else ToolEnd
        with self._lock:
            self._write(event(self._ts(time.monotonic()), workflow, agent, tool))

    def on_plan_event(self, event: dict[str, Any]) -> None:
        """A plan (into the meta line, while it is not written), a next or an agent_done event."""
        kind = event["type"]
        with self._lock:
            if kind == "plan":
                plan = plan_fields(event["plan"])
                if self._writer is None and self._meta.plan is None:
                    self._meta.plan, self._plan_app = plan, event["app"]
                elif (self._plan_app, self._meta.plan) != (event["app"], plan):
                    warn_once(
                        "recorded_plan",
                        f"agentcache: the plan of app {event['app']!r} came after the recording began: the trace's"
                        " meta line holds the plan given before its first event",
                    )
            elif kind == "next":
                self._write(Next(self._ts(time.monotonic()), event["workflow"], tuple(event["agents"])))
            elif kind == "agent_done":
                self._write(AgentDone(self._ts(time.monotonic()), event["workflow"], event["agent"]))

    def close(self) -> None:
        with self._lock:
            self._opened().close()


class record:  # noqa: N801 - a context manager, spelled like a function
    """Record the tagged LLM requests, tool pauses, the app's plan and decisions, and workflow ends made inside the
    block to a trace file.

    A file that holds a recording already is refused (FileExistsError), never truncated; with `append` the
    events go after its own, their times continuing from its last."""

    def __init__(self, path: str | Path, name: str = "recorded", *, append: bool = False):
        self.recorder = Recorder(path, name, append=append)

    def __enter__(self) -> Recorder:
        _answers.observers.append(self.recorder.on_request)
        _workflow.end_observers.append(self.recorder.on_end)
        _tools.observers.append(self.recorder.on_tool)
        _plan.observers.append(self.recorder.on_plan_event)
        return self.recorder

    def __exit__(self, *exc: object) -> None:
        _answers.observers.remove(self.recorder.on_request)
        _workflow.end_observers.remove(self.recorder.on_end)
        _tools.observers.remove(self.recorder.on_tool)
        _plan.observers.remove(self.recorder.on_plan_event)
        self.recorder.close()
