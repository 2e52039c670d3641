"""The events of a workflow trace (format v1) and the trace itself; docs/design/trace-format.md."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, NamedTuple

from agentcache.tags import TagError, check_id

FORMAT_VERSION = 1


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


class EventFieldError(ValueError):
    """A field of an event that breaks the format: `field` names it, `reason` is a short code for counters."""

    def __init__(self, field_name: str, message: str):
        self.field, self.reason = field_name, f"bad_{field_name}"
        super().__init__(message)


TOOL_FIELDS = ("workflow", "agent", "tool")


def tool_fields(obj: Mapping[str, Any]) -> tuple[str, str, str]:
    """The workflow, agent and tool of a tool event's object: each an id as the tags' ids are (1-256 printable
    characters, `agentcache.tags.check_id`), else EventFieldError naming the field. The one check of these fields,
    for a trace's line and for what a client sends the server."""
    try:
        workflow, agent, tool = (check_id(name, obj.get(name)) for name in TOOL_FIELDS)
    except TagError as exc:
        raise EventFieldError(exc.reason.removeprefix("bad_"), str(exc)) from None
    return workflow, agent, tool


@dataclass(frozen=True, slots=True)
class ToolEvent:
    """An agent's tool call: it began (ToolStart: the agent waits on the tool) or ended (ToolEnd: the agent's next
    call, which re-sends its prompt, its answer and the tool's result, comes next)."""

    TYPE: ClassVar[str] = ""
    ts: float
    workflow: str
    agent: str
    tool: str

    def to_json(self) -> dict[str, Any]:
        return {"type": self.TYPE, "ts": self.ts, "workflow": self.workflow, "agent": self.agent, "tool": self.tool}


@dataclass(frozen=True, slots=True)
class ToolStart(ToolEvent):
    TYPE: ClassVar[str] = "tool_start"


@dataclass(frozen=True, slots=True)
class ToolEnd(ToolEvent):
    TYPE: ClassVar[str] = "tool_end"


Event = Request | End | ToolStart | ToolEnd

# Events a replay can be asked to leave out (`agentcache replay --ignore-events`), by group name: what the
# trace says beside its requests and ends, which a policy may use and must do as well without.
EVENT_GROUPS: dict[str, tuple[type, ...]] = {"tool": (ToolStart, ToolEnd)}


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
    # Lines of event types the reader does not know, left out: type -> how many (read_trace says so too).
    skipped: dict[str, int] = field(default_factory=dict)

    @property
    def requests(self) -> list[Request]:
        return [e for e in self.events if isinstance(e, Request)]

    @property
    def ended_workflows(self) -> set[str]:
        return {e.workflow for e in self.events if isinstance(e, End)}

    def without(self, groups: Iterable[str]) -> Trace:
        """The trace with the events of `groups` (names in EVENT_GROUPS) left out; KeyError names an unknown one."""
        left_out = tuple(kind for group in groups for kind in EVENT_GROUPS[group])
        if not left_out:
            return self
        return Trace(self.meta, [e for e in self.events if not isinstance(e, left_out)], dict(self.skipped))
