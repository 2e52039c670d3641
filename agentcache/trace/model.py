"""The events of a workflow trace (format v1) and the trace itself; docs/design/trace-format.md."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
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


def _id(field_name: str, value: Any, where: str = "") -> str:
    """`value` if it is an id as the tags' ids are, else EventFieldError naming `field_name` (the message says
    `where` inside it, so the field names stay a short fixed set, fit for counters)."""
    try:
        return check_id(field_name, value)
    except TagError as exc:
        raise EventFieldError(field_name, f"{exc}{where}") from None


TOOL_FIELDS = ("workflow", "agent", "tool")


def tool_fields(obj: Mapping[str, Any]) -> tuple[str, str, str]:
    """The workflow, agent and tool of a tool event's object: each an id as the tags' ids are (1-256 printable
    characters, `agentcache.tags.check_id`), else EventFieldError naming the field. The one check of these fields,
    for a trace's line and for what a client sends the server."""
    workflow, agent, tool = (_id(name, obj.get(name)) for name in TOOL_FIELDS)
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


MAX_NEXT_AGENTS = 16  # agents one `next` event may name
MAX_PLAN_AGENTS = 256  # distinct agents one plan may name
MAX_PLAN_BYTES = 64 * 1024  # a plan's JSON, UTF-8


def _ids(field_name: str, value: Any, limit: int) -> tuple[str, ...]:
    """A list of 1..`limit` distinct ids, else EventFieldError naming `field_name`."""
    if not isinstance(value, list) or not 1 <= len(value) <= limit:
        raise EventFieldError(field_name, f"'{field_name}' must be a list of 1 to {limit} ids, got {value!r:.80}")
    ids = tuple(_id(field_name, v, f" (item {i})") for i, v in enumerate(value))
    if len(set(ids)) != len(ids):
        raise EventFieldError(field_name, f"'{field_name}' names an agent twice: {list(ids)!r:.120}")
    return ids


def next_fields(obj: Mapping[str, Any]) -> tuple[str, tuple[str, ...]]:
    """The workflow and agents of a `next` event's object (the agents the framework has decided make the
    workflow's next call: 1 to MAX_NEXT_AGENTS distinct ids), else EventFieldError naming the field. The one
    check, for a trace's line and for what a client sends the server."""
    return _id("workflow", obj.get("workflow")), _ids("agents", obj.get("agents"), MAX_NEXT_AGENTS)


def agent_done_fields(obj: Mapping[str, Any]) -> tuple[str, str]:
    """The workflow and agent of an `agent_done` event's object, else EventFieldError naming the field."""
    return _id("workflow", obj.get("workflow")), _id("agent", obj.get("agent"))


@dataclass(frozen=True, slots=True)
class Next:
    """The framework has decided which agents make the workflow's next call (one agent, or any of several)."""

    TYPE: ClassVar[str] = "next"
    ts: float
    workflow: str
    agents: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {"type": self.TYPE, "ts": self.ts, "workflow": self.workflow, "agents": list(self.agents)}


@dataclass(frozen=True, slots=True)
class AgentDone:
    """The agent's context in the workflow will not be read again (its phase or task is done, its last turn was
    known, or the app said `reuse_hint: "evict"`)."""

    TYPE: ClassVar[str] = "agent_done"
    ts: float
    workflow: str
    agent: str

    def to_json(self) -> dict[str, Any]:
        return {"type": self.TYPE, "ts": self.ts, "workflow": self.workflow, "agent": self.agent}


@dataclass(frozen=True, slots=True)
class Plan:
    """What an app's framework knows of its workflows before they run, any subset of: the agent graph (agent ->
    the agents that may call next), a fixed speaking order (round robin, a sequential task list), a turn limit,
    and a chain of phases, each with its agents. Not to be mutated (`graph` is a dict for reading)."""

    TYPE: ClassVar[str] = "plan"  # the meta line's key (and the wire's event type) that holds it
    graph: dict[str, tuple[str, ...]] | None = None
    order: tuple[str, ...] | None = None
    max_turns: int | None = None
    chain: tuple[tuple[str, tuple[str, ...]], ...] | None = None

    @property
    def agents(self) -> set[str]:
        """Every agent the plan names."""
        out = set(self.order or ())
        for agent, successors in (self.graph or {}).items():
            out.add(agent)
            out.update(successors)
        for _, agents in self.chain or ():
            out.update(agents)
        return out

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.graph is not None:
            out["graph"] = {agent: list(successors) for agent, successors in self.graph.items()}
        if self.order is not None:
            out["order"] = list(self.order)
        if self.max_turns is not None:
            out["max_turns"] = self.max_turns
        if self.chain is not None:
            out["chain"] = [[phase, list(agents)] for phase, agents in self.chain]
        return out


def plan_fields(obj: Any) -> Plan:
    """The plan of a plan object (`{"graph": {agent: [agents]}, "order": [agents], "max_turns": N, "chain": [[phase,
    [agents]], ...]}`, any subset of the keys, other keys ignored; at most MAX_PLAN_AGENTS distinct agents and
    MAX_PLAN_BYTES of JSON), else EventFieldError naming the field ("plan", "plan.graph", "plan.order",
    "plan.max_turns", "plan.chain"; the message says where inside it). The one check, for a trace's meta line and
    for what a client sends the server."""
    if not isinstance(obj, Mapping):
        raise EventFieldError("plan", f"'plan' must be an object, got {type(obj).__name__}")
    try:
        size = len(json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode())
    except (TypeError, ValueError) as exc:
        raise EventFieldError("plan", f"'plan' is not plain JSON: {exc}") from None
    if size > MAX_PLAN_BYTES:
        raise EventFieldError("plan", f"'plan' is {size} bytes of JSON (at most {MAX_PLAN_BYTES})")
    graph = None
    if "graph" in obj:
        raw = obj["graph"]
        if not isinstance(raw, Mapping):
            raise EventFieldError("plan.graph", "'plan.graph' must be an object mapping agent -> list of agents")
        graph = {}
        for agent, successors in raw.items():
            where = f" (under {agent!r:.60})"
            if not isinstance(successors, list):
                raise EventFieldError("plan.graph", f"'plan.graph' must map each agent to a list{where}")
            graph[_id("plan.graph", agent)] = tuple(_id("plan.graph", s, where) for s in successors)
    order = _ids("plan.order", obj["order"], MAX_PLAN_AGENTS) if "order" in obj else None
    max_turns = obj.get("max_turns")
    if max_turns is not None and (isinstance(max_turns, bool) or not isinstance(max_turns, int) or max_turns < 1):
        raise EventFieldError("plan.max_turns", f"'plan.max_turns' must be an integer >= 1, got {max_turns!r:.40}")
    chain = None
    if "chain" in obj:
        raw = obj["chain"]
        if not isinstance(raw, list):
            raise EventFieldError("plan.chain", "'plan.chain' must be a list of [phase, [agents]] pairs")
        phases = []
        for i, pair in enumerate(raw):
            if not isinstance(pair, list) or len(pair) != 2:
                raise EventFieldError("plan.chain", f"'plan.chain' item {i} must be [phase, [agents]]")
            phases.append((_id("plan.chain", pair[0], f" (item {i})"), _ids("plan.chain", pair[1], MAX_PLAN_AGENTS)))
        chain = tuple(phases)
    plan = Plan(graph, order, max_turns, chain)
    if len(plan.agents) > MAX_PLAN_AGENTS:
        raise EventFieldError("plan", f"'plan' names {len(plan.agents)} agents (at most {MAX_PLAN_AGENTS})")
    return plan


Event = Request | End | ToolStart | ToolEnd | Next | AgentDone

# What a replay can be asked to leave out (`agentcache replay --ignore-events`), by group name: what the trace
# says beside its requests and ends, which a policy may use and must do as well without. "plan" is the meta
# line's plan, not an event.
EVENT_GROUPS: dict[str, tuple[type, ...]] = {"tool": (ToolStart, ToolEnd), "next": (Next, AgentDone), "plan": (Plan,)}


@dataclass(slots=True)
class Meta:
    name: str = ""
    description: str = ""
    call_graph: dict[str, list[str]] | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    # What the app's framework knows before its workflows run, which online policies may read (call_graph, the
    # generator's own, they may not): the plan of the app its requests name (docs/design/trace-format.md).
    plan: Plan | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "meta", "version": FORMAT_VERSION, **self.extra}
        out["name"] = self.name
        if self.description:
            out["description"] = self.description
        if self.call_graph is not None:
            out["call_graph"] = self.call_graph
        if self.plan is not None:
            out["plan"] = self.plan.to_json()
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
        meta = replace(self.meta, plan=None) if Plan in left_out else self.meta
        return Trace(meta, [e for e in self.events if not isinstance(e, left_out)], dict(self.skipped))
