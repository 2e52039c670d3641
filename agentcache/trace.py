"""Workflow trace format, version 1 (docs/design/trace-format.md): reading, validating, writing.

A trace is JSON Lines: an optional ``meta`` line, then ``request`` and ``end``
events in the order they were sent. Every malformed line raises
:class:`TraceError` naming the file, the line and the field; nothing is
skipped silently. One exception: a last line cut short (no newline at its
end, not JSON: a recorder killed mid-write) is left out with a
:class:`TornTraceWarning` naming the file and the line. Unknown fields are
ignored so newer writers stay readable.
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, NamedTuple

from agentcache.atomic import atomic_write

FORMAT_VERSION = 1


class TraceError(ValueError):
    """A trace line that breaks the format; says where and what."""

    def __init__(self, source: str, line: int, field_name: str | None, message: str):
        self.source, self.line, self.field, self.message = source, line, field_name, message
        where = f"{source}:{line}"
        what = f"field '{field_name}': {message}" if field_name else message
        super().__init__(f"{where}: {what}")


class TornTraceWarning(UserWarning):
    """A trace's last line was cut short (its writer stopped mid-line) and is left out."""


class Segment(NamedTuple):
    content_id: str
    tokens: int


@dataclass(frozen=True, slots=True)
class Request:
    ts: float
    workflow: str
    agent: str
    segments: tuple[Segment, ...]
    fixed: int
    output: int
    output_id: str | None = None
    app: str | None = None
    prompt_hidden: tuple[float, ...] | None = None

    @property
    def prompt_tokens(self) -> int:
        return sum(s.tokens for s in self.segments)

    @property
    def fixed_tokens(self) -> int:
        return sum(s.tokens for s in self.segments[: self.fixed])

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "type": "request",
            "ts": self.ts,
            "workflow": self.workflow,
            "agent": self.agent,
            "segments": [[s.content_id, s.tokens] for s in self.segments],
            "fixed": self.fixed,
            "output": self.output,
        }
        if self.output_id is not None:
            out["output_id"] = self.output_id
        if self.app is not None:
            out["app"] = self.app
        if self.prompt_hidden is not None:
            out["prompt_hidden"] = list(self.prompt_hidden)
        return out


@dataclass(frozen=True, slots=True)
class End:
    ts: float
    workflow: str

    def to_json(self) -> dict[str, Any]:
        return {"type": "end", "ts": self.ts, "workflow": self.workflow}


Event = Request | End


@dataclass(slots=True)
class Meta:
    name: str = ""
    description: str = ""
    call_graph: dict[str, list[str]] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "meta", "version": FORMAT_VERSION, **self.extra}
        out["name"] = self.name
        if self.description:
            out["description"] = self.description
        if self.call_graph is not None:
            out["call_graph"] = self.call_graph
        return out


@dataclass(slots=True)
class Trace:
    meta: Meta
    events: list[Event]

    @property
    def requests(self) -> list[Request]:
        return [e for e in self.events if isinstance(e, Request)]

    @property
    def ended_workflows(self) -> set[str]:
        return {e.workflow for e in self.events if isinstance(e, End)}


# ---------------------------------------------------------------- reading


class _LineParser:
    """Validates one trace, line by line, keeping the cross-line state the format needs."""

    def __init__(self, source: str):
        self.source = source
        self.last_ts = 0.0
        self.segment_lengths: dict[str, tuple[int, int]] = {}  # content id -> (tokens, first line)
        self.ended: dict[str, int] = {}  # workflow -> line of its end event
        self.seen_event = False

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
        raise self.error(line_no, "type", f"expected 'meta', 'request' or 'end', got {kind!r}")

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
        known = {"type", "version", "name", "description", "call_graph"}
        return Meta(
            name=obj.get("name", ""),
            description=obj.get("description", ""),
            call_graph=graph,
            extra={k: v for k, v in obj.items() if k not in known},
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

    def _end(self, line: int, obj: dict) -> End:
        ts = self._ts(line, obj)
        workflow = self._str(line, obj, "workflow")
        if workflow in self.ended:
            raise self.error(line, "workflow", f"workflow {workflow!r} already ended on line {self.ended[workflow]}")
        self.ended[workflow] = line
        return End(ts, workflow)


def iter_trace(lines: Iterable[str], source: str = "<trace>", *, torn_tail: bool = False) -> Iterator[Meta | Event]:
    """Parse trace lines lazily; raises TraceError at the first malformed line. With `torn_tail` (lines read from
    a file, each with its newline) a last line cut short is left out with a TornTraceWarning instead."""
    parser = _LineParser(source)
    numbered = enumerate(lines, start=1)
    current = next(numbered, None)
    while current is not None:
        line_no, text = current
        current = next(numbered, None)
        if torn_tail and current is None and _torn(text):
            warnings.warn(
                f"{source}:{line_no}: the last line is cut short (no newline, not JSON), as a writer stopped"
                " mid-line leaves it; it is left out",
                TornTraceWarning,
                stacklevel=2,
            )
            return
        item = parser.parse(line_no, text)
        if item is not None:
            yield item


def _torn(text: str) -> bool:
    """Whether a last line was cut short: no newline at its end (every writer ends a line with one) and not JSON."""
    if text.endswith("\n") or not text.strip():
        return False
    try:
        json.loads(text)
    except json.JSONDecodeError:
        return True
    return False


def read_trace(path: str | Path) -> Trace:
    """Read and validate a whole trace file (a torn last line left out, with a TornTraceWarning)."""
    path = Path(path)
    meta = Meta()
    events: list[Event] = []
    with path.open(encoding="utf-8") as fh:
        for item in iter_trace(fh, str(path), torn_tail=True):
            if isinstance(item, Meta):
                meta = item
            else:
                events.append(item)
    return Trace(meta, events)


# ---------------------------------------------------------------- writing


class TraceWriter:
    """Streams a trace to a file (or any text stream), one event per line, flushed as written.

    Events are validated exactly as the reader would, so a writer can never
    produce a trace its own reader rejects. A recording is never truncated
    unasked: a file that is not empty is refused (FileExistsError) unless
    `append`, which adds events after its own, validated as one trace with them
    (`meta` only goes into a new file; a torn last line is refused: appending
    would bury it mid-file).
    """

    def __init__(self, target: str | Path | IO[str], meta: Meta | None = None, *, append: bool = False):
        self._own = not hasattr(target, "write")
        self._source = str(target) if self._own else getattr(target, "name", "<stream>")
        self._parser = _LineParser(self._source)
        self._line = 0
        self._fh: IO[str] = self._open(Path(target), append) if self._own else target  # type: ignore[arg-type]
        if meta is not None and not self._parser.seen_event:
            self._emit(meta.to_json())

    def _open(self, path: Path, append: bool) -> IO[str]:
        fh = open(path, "a+", encoding="utf-8")  # never truncates; creates a new file
        try:
            fh.seek(0)
            if fh.read(1) and not append:
                raise FileExistsError(
                    f"{path}: a trace is there already; a trace writer never overwrites one (append=True adds to"
                    " it; remove the file to start over)"
                )
            fh.seek(0)
            text = "\n"
            for self._line, text in enumerate(fh, start=1):
                if _torn(text):  # only a last line can lack its newline
                    raise TraceError(self._source, self._line, None, "the last line is cut short; remove it to append")
                self._parser.parse(self._line, text)
            if not text.endswith("\n"):  # a last line whole but with no newline: the next event starts a line
                fh.write("\n")
        except BaseException:
            fh.close()
            raise
        return fh  # "a+": every write goes to the end

    @property
    def last_ts(self) -> float:
        """The latest event time written (or read, when appending): the next event's may not be earlier."""
        return self._parser.last_ts

    def _emit(self, obj: dict[str, Any]) -> None:
        text = json.dumps(obj, ensure_ascii=False)
        self._line += 1
        self._parser.parse(self._line, text)
        self._fh.write(text + "\n")
        self._fh.flush()

    def write(self, event: Event) -> None:
        self._emit(event.to_json())

    def close(self) -> None:
        if self._own:
            self._fh.close()

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def write_trace(path: str | Path, trace: Trace) -> None:
    """Write a whole trace to `path`, replacing what is there whole or not at all (atomic_write)."""
    with atomic_write(path) as fh, TraceWriter(fh, trace.meta) as writer:
        for event in trace.events:
            writer.write(event)
