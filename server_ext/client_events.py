"""A client's events (``POST /agentcache/v1/events``), read and checked in the HTTP process.

The body is ``{"events": [...]}``: 1 to MAX_EVENTS events in the order they happened, no time (the server stamps
its own clock on arrival: server_ext/control.py, server_clock), each one of

- ``{"type": "tool_start" | "tool_end", "workflow": W, "agent": A, "tool": NAME}``: an agent waits on a tool;
- ``{"type": "next", "workflow": W, "agents": [A, ...]}``: the framework decided who makes W's next call;
- ``{"type": "agent_done", "workflow": W, "agent": A}``: A's context in W will not be read again;
- ``{"type": "plan", "app": APP, "plan": {...}}``: the app's plan (graph, order, max_turns, chain).

Each event's fields are checked by the trace's one check of them (agentcache.trace: tool_fields, next_fields,
agent_done_fields, plan_fields; the tags' id rules). All or nothing: the first invalid event refuses the whole
batch, named by its index and field (``events[2].tool: ...``). An event whose type this server does not know
(a newer client's) is skipped and counted, never refused. What is refused and skipped is decided here, so it
costs the scheduler nothing; its counts (:class:`EventCounts`) travel to the scheduler with each statistics
call. The events that are left go to every scheduler in one control call (server_ext/cache.py, client_events),
each as a flat list (:data:`Checked`). Reference: docs/design/wire-format.md#client-events.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import orjson

from agentcache.server_ext.records import TenantCounters
from agentcache.tags import check_id, scoped_agent
from agentcache.trace import (
    AgentDone,
    EventFieldError,
    Next,
    Plan,
    ToolEnd,
    ToolStart,
    agent_done_fields,
    next_fields,
    plan_fields,
    tool_fields,
)

MAX_EVENTS = 256
# The largest valid batch is ~2.4 MB: 256 events of three 256-character ids, each character escaped as JSON may
# (12 bytes for one outside the BMP). The rest is room for a newer client's fields.
MAX_BODY_BYTES = 4 << 20
# Each known event as the scheduler gets it: [type, workflow, agent, tool], [type, workflow, [agents]],
# [type, workflow, agent], or [type, app, plan] (the checked plan's JSON, read again by plan_fields there).
Checked = list[Any]


def _tool(event: dict[str, Any]) -> Checked:
    return list(tool_fields(event))


def _next(event: dict[str, Any]) -> Checked:
    workflow, agents = next_fields(event)
    return [workflow, list(agents)]


def _agent_done(event: dict[str, Any]) -> Checked:
    return list(agent_done_fields(event))


def _plan(event: dict[str, Any]) -> Checked:
    try:
        app = check_id("app", event.get("app"))
    except ValueError as exc:
        raise EventFieldError("app", str(exc)) from None
    return [app, plan_fields(event.get("plan")).to_json()]  # the plan's own keys alone


_CHECKS = {ToolStart.TYPE: _tool, ToolEnd.TYPE: _tool, Next.TYPE: _next, AgentDone.TYPE: _agent_done, Plan.TYPE: _plan}
KNOWN_TYPES = frozenset(_CHECKS)


class BatchError(ValueError):
    """A body refused whole (HTTP 400): the message names the event and field; `events`, how many it held."""

    def __init__(self, message: str, events: int):
        super().__init__(message)
        self.events = events


@dataclass(frozen=True, slots=True)
class Batch:
    events: list[Checked]  # each known event, [type, *its checked fields], in order
    skipped: int  # events of types this server does not know


def parse_batch(raw: bytes) -> Batch:
    """The batch a body holds, else BatchError naming what is wrong (the first invalid event, by index and field)."""
    try:
        body = orjson.loads(raw)  # nesting deeper than 1,024 levels is a JSONDecodeError too, never a RecursionError
    except orjson.JSONDecodeError as exc:
        raise BatchError(f"the body is not JSON: {exc}", 1) from None
    events = body.get("events") if isinstance(body, dict) else None
    if not isinstance(events, list):
        raise BatchError('the body must be an object {"events": [...]}', 1)
    if not 1 <= len(events) <= MAX_EVENTS:
        raise BatchError(f"events: {len(events)} events; a batch holds 1 to {MAX_EVENTS}", len(events))
    known: list[Checked] = []
    skipped = 0
    for i, event in enumerate(events):
        if not isinstance(event, dict):
            raise BatchError(f"events[{i}]: must be an object, got {type(event).__name__}", len(events))
        kind = event.get("type")
        if not isinstance(kind, str) or not kind:
            raise BatchError(f"events[{i}].type: must be a non-empty string, got {kind!r:.40}", len(events))
        check = _CHECKS.get(kind)
        if check is None:
            skipped += 1
            continue
        try:
            known.append([kind, *check(event)])
        except EventFieldError as exc:
            raise BatchError(f"events[{i}].{exc.field}: {exc}", len(events)) from None
    return Batch(known, skipped)


def scoped_plan(plan: Plan, principal: str) -> Plan:
    """`plan` with its agents scoped by `principal` as the identities of its tenant's requests are (the scheduler's
    reading: agentcache.tags.scoped_agent), so no tenant's plan names another's agents."""
    if not principal:
        return plan

    def scoped(agents: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(scoped_agent(principal, a) for a in agents)

    return Plan(
        graph=None if plan.graph is None else {scoped_agent(principal, a): scoped(s) for a, s in plan.graph.items()},
        order=None if plan.order is None else scoped(plan.order),
        max_turns=plan.max_turns,
        chain=None if plan.chain is None else tuple((phase, scoped(agents)) for phase, agents in plan.chain),
    )


class EventCounts:
    """The events the HTTP process skipped and refused: per tenant (bounded as the scheduler's counters are:
    records.TenantCounters) and in all, for the statistics."""

    def __init__(self) -> None:
        self.tenants = TenantCounters()
        self.total: Counter[str] = Counter()

    def count(self, tenant: str, name: str, n: int) -> None:
        if n:
            self.tenants.count(tenant, name, n)
            self.total[name] += n

    def of(self, tenant: str, operator: bool) -> dict[str, Any]:
        """What `tenant` may see: its own counts; the operator's are every tenant's."""
        c = self.total if operator else self.tenants.of(tenant)
        return {"skipped": c["skipped"], "refused": c["refused"]}
