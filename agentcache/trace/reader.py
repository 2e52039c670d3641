"""Reading and validating a workflow trace (format v1, docs/design/trace-format.md), line by line.

Every malformed line of a known type raises :class:`TraceError` naming the file, the line and the field;
nothing is skipped silently. Two things are left out, and said: the lines of event types this reader does not
know (newer writers add types within version 1), counted per type in an :class:`UnknownEventsWarning` and in
``Trace.skipped``; and a last line cut short (no newline at its end, not JSON: a recorder killed mid-write), in
a :class:`TornTraceWarning` naming the file and the line. Unknown fields are ignored so newer writers stay
readable.
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from agentcache.trace.model import (
    FORMAT_VERSION,
    AgentDone,
    End,
    Event,
    EventFieldError,
    Meta,
    Next,
    Request,
    Segment,
    ToolEnd,
    ToolStart,
    Trace,
    agent_done_fields,
    next_fields,
    plan_fields,
    tool_fields,
)


class TraceError(ValueError):
    """A trace line that breaks the format; says where and what."""

    def __init__(self, source: str, line: int, field_name: str | None, message: str):
        self.source, self.line, self.field, self.message = source, line, field_name, message
        where = f"{source}:{line}"
        what = f"field '{field_name}': {message}" if field_name else message
        super().__init__(f"{where}: {what}")


class TornTraceWarning(UserWarning):
    """A trace's last line was cut short (its writer stopped mid-line) and is left out."""


class UnknownEventsWarning(UserWarning):
    """A trace holds events of types this reader does not know (a newer writer's): they were left out, counted."""


# Events about a workflow's agents: type -> (its class, the check of its fields the server applies too).
HINT_EVENTS: dict[str, tuple[type[ToolStart | ToolEnd | Next | AgentDone], Callable[[dict], tuple]]] = {
    ToolStart.TYPE: (ToolStart, tool_fields),
    ToolEnd.TYPE: (ToolEnd, tool_fields),
    Next.TYPE: (Next, next_fields),
    AgentDone.TYPE: (AgentDone, agent_done_fields),
}


class LineParser:
    """Validates one trace, line by line, keeping the cross-line state the format needs."""

    def __init__(self, source: str):
        self.source = source
        self.last_ts = 0.0
        self.segment_lengths: dict[str, tuple[int, int]] = {}  # content id -> (tokens, first line)
        self.ended: dict[str, int] = {}  # workflow -> line of its end event
        self.seen_event = False
        self.skipped: dict[str, tuple[int, int]] = {}  # unknown event type -> (lines, first line)

    def error(self, line: int, field_name: str | None, message: str) -> TraceError:
        return TraceError(self.source, line, field_name, message)

    def parse(self, line_no: int, text: str) -> Meta | Event | None:
        if not text.strip():
            return None
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as exc:
            raise self.error(line_no, None, f"not valid JSON ({exc.msg} at column {exc.colno})") from None
        if not isinstance(obj, dict):
            raise self.error(line_no, None, f"expected a JSON object, got {type(obj).__name__}")
        kind = obj.get("type")
        if kind == "meta":
            if self.seen_event:
                raise self.error(line_no, "type", "a meta line may only be the first line")
            self.seen_event = True
            return self._meta(line_no, obj)
        self.seen_event = True
        if kind == "request":
            return self._request(line_no, obj)
        if kind == "end":
            return self._end(line_no, obj)
        if kind in HINT_EVENTS:
            return self._hint(line_no, obj, *HINT_EVENTS[kind])
        if not isinstance(kind, str) or not kind:
            raise self.error(line_no, "type", f"expected an event type (a non-empty string), got {kind!r}")
        count, first = self.skipped.get(kind, (0, line_no))
        self.skipped[kind] = (count + 1, first)
        return None

    def skipped_counts(self) -> dict[str, int]:
        return {kind: count for kind, (count, _) in self.skipped.items()}

    def skipped_message(self) -> str:
        """What was left out, for a warning: how many lines of which types, and where each type first was."""
        total = sum(count for count, _ in self.skipped.values())
        types = ", ".join(
            f"{kind!r} x{count} (first on line {first})" for kind, (count, first) in sorted(self.skipped.items())
        )
        return (
            f"{self.source}: {total} event{'s' if total != 1 else ''} of types this reader does not know left out:"
            f" {types}"
        )

    # -- field helpers

    def _str(self, line: int, obj: dict, name: str, *, required: bool = True) -> str | None:
        value = obj.get(name)
        if value is None and not required:
            return None
        if not isinstance(value, str) or not value:
            raise self.error(line, name, f"expected a non-empty string, got {value!r}")
        return value

    def _int(self, line: int, value: Any, name: str, minimum: int) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.error(line, name, f"expected an integer, got {value!r}")
        if value < minimum:
            raise self.error(line, name, f"must be >= {minimum}, got {value}")
        return value

    def _ts(self, line: int, obj: dict) -> float:
        ts = obj.get("ts")
        if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not math.isfinite(ts) or ts < 0:
            raise self.error(line, "ts", f"expected a finite number >= 0, got {ts!r}")
        if ts < self.last_ts:
            raise self.error(line, "ts", f"timestamps must not decrease ({ts} after {self.last_ts})")
        self.last_ts = float(ts)
        return float(ts)

    def _check_length(self, line: int, name: str, content_id: str, tokens: int) -> None:
        known = self.segment_lengths.get(content_id)
        if known is None:
            self.segment_lengths[content_id] = (tokens, line)
        elif known[0] != tokens:
            raise self.error(
                line,
                name,
                f"content id {content_id!r} has {tokens} tokens here but {known[0]} on line {known[1]}",
            )

    # -- events

    def _meta(self, line: int, obj: dict) -> Meta:
        version = obj.get("version")
        if version != FORMAT_VERSION or isinstance(version, bool):
            raise self.error(line, "version", f"only version {FORMAT_VERSION} is supported, got {version!r}")
        graph = obj.get("call_graph")
        if graph is not None:
            if not isinstance(graph, dict):
                raise self.error(line, "call_graph", "expected an object mapping agent -> list of agents")
            for agent, successors in graph.items():
                if not isinstance(successors, list) or not all(isinstance(s, str) and s for s in successors):
                    raise self.error(line, f"call_graph.{agent}", f"expected a list of agent ids, got {successors!r}")
        for name in ("name", "description"):
            if name in obj and not isinstance(obj[name], str):
                raise self.error(line, name, f"expected a string, got {obj[name]!r}")
        plan = None
        if "plan" in obj:
            try:
                plan = plan_fields(obj["plan"])
            except EventFieldError as exc:
                raise self.error(line, exc.field, str(exc)) from None
        known = {"type", "version", "name", "description", "call_graph", "plan"}
        return Meta(
            name=obj.get("name", ""),
            description=obj.get("description", ""),
            call_graph=graph,
            extra={k: v for k, v in obj.items() if k not in known},
            plan=plan,
        )

    def _request(self, line: int, obj: dict) -> Request:
        ts = self._ts(line, obj)
        workflow = self._str(line, obj, "workflow")
        agent = self._str(line, obj, "agent")
        if workflow in self.ended:
            raise self.error(
                line,
                "workflow",
                f"request for workflow {workflow!r} after its end event on line {self.ended[workflow]}",
            )
        raw = obj.get("segments")
        if not isinstance(raw, list) or not raw:
            raise self.error(line, "segments", f"expected a non-empty list of [content_id, tokens], got {raw!r}")
        segments = []
        for i, seg in enumerate(raw):
            name = f"segments[{i}]"
            if not isinstance(seg, list) or len(seg) != 2:
                raise self.error(line, name, f"expected [content_id, tokens], got {seg!r}")
            content_id, tokens = seg
            if not isinstance(content_id, str) or not content_id:
                raise self.error(line, f"{name}[0]", f"expected a non-empty content id, got {content_id!r}")
            tokens = self._int(line, tokens, f"{name}[1]", 1)
            self._check_length(line, f"{name}[1]", content_id, tokens)
            segments.append(Segment(content_id, tokens))
        fixed = self._int(line, obj.get("fixed"), "fixed", 0)
        if fixed > len(segments):
            raise self.error(line, "fixed", f"{fixed} fixed segments but the prompt has only {len(segments)}")
        output = self._int(line, obj.get("output"), "output", 1)
        output_id = self._str(line, obj, "output_id", required=False)
        if output_id is not None:
            self._check_length(line, "output", output_id, output)
        app = self._str(line, obj, "app", required=False)
        hidden = obj.get("prompt_hidden")
        if hidden is not None:
            if not isinstance(hidden, list) or not all(
                isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in hidden
            ):
                raise self.error(line, "prompt_hidden", "expected a list of finite numbers")
            hidden = tuple(float(x) for x in hidden)
        return Request(ts, workflow, agent, tuple(segments), fixed, output, output_id, app, hidden)

    def _hint(
        self, line: int, obj: dict, kind: type[ToolStart | ToolEnd | Next | AgentDone], check: Callable[[dict], tuple]
    ) -> ToolStart | ToolEnd | Next | AgentDone:
        ts = self._ts(line, obj)
        try:
            fields = check(obj)
        except EventFieldError as exc:
            raise self.error(line, exc.field, str(exc)) from None
        self._before_end(line, kind.TYPE, fields[0])
        return kind(ts, *fields)

    def _before_end(self, line: int, kind: str, workflow: str) -> None:
        """An event about a workflow comes before its end event, never after."""
        if workflow in self.ended:
            raise self.error(
                line, "workflow", f"{kind} for workflow {workflow!r} after its end event on line {self.ended[workflow]}"
            )

    def _end(self, line: int, obj: dict) -> End:
        ts = self._ts(line, obj)
        workflow = self._str(line, obj, "workflow")
        if workflow in self.ended:
            raise self.error(line, "workflow", f"workflow {workflow!r} already ended on line {self.ended[workflow]}")
        self.ended[workflow] = line
        return End(ts, workflow)


def iter_trace(
    lines: Iterable[str], source: str = "<trace>", *, torn_tail: bool = False, skipped: dict[str, int] | None = None
) -> Iterator[Meta | Event]:
    """Parse trace lines lazily; raises TraceError at the first malformed line. With `torn_tail` (lines read from
    a file, each with its newline) a last line cut short is left out with a TornTraceWarning instead. Lines of
    event types this reader does not know are left out and counted: once the lines are read, in an
    UnknownEventsWarning and in `skipped` (type -> lines), where given."""
    parser = LineParser(source)
    numbered = enumerate(lines, start=1)
    current = next(numbered, None)
    while current is not None:
        line_no, text = current
        current = next(numbered, None)
        if torn_tail and current is None and torn(text):
            warnings.warn(
                f"{source}:{line_no}: the last line is cut short (no newline, not JSON), as a writer stopped"
                " mid-line leaves it; it is left out",
                TornTraceWarning,
                stacklevel=2,
            )
            break
        item = parser.parse(line_no, text)
        if item is not None:
            yield item
    if parser.skipped:
        if skipped is not None:
            skipped.update(parser.skipped_counts())
        warnings.warn(parser.skipped_message(), UnknownEventsWarning, stacklevel=2)


def torn(text: str) -> bool:
    """Whether a last line was cut short: no newline at its end (every writer ends a line with one) and not JSON."""
    if text.endswith("\n") or not text.strip():
        return False
    try:
        json.loads(text)
    except json.JSONDecodeError:
        return True
    return False


def read_trace(path: str | Path) -> Trace:
    """Read and validate a whole trace file (a torn last line left out, with a TornTraceWarning; events of types
    this reader does not know left out, counted in `Trace.skipped` and an UnknownEventsWarning)."""
    path = Path(path)
    meta = Meta()
    events: list[Event] = []
    skipped: dict[str, int] = {}
    with path.open(encoding="utf-8") as fh:
        for item in iter_trace(fh, str(path), torn_tail=True, skipped=skipped):
            if isinstance(item, Meta):
                meta = item
            else:
                events.append(item)
    return Trace(meta, events, skipped)
