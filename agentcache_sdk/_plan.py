"""The app's plan and its framework's decisions, told to the server: what it forecasts an app's workflows from.

A framework often knows, before a call is made, which agent makes it; the server cannot. Three kinds of event
say so, sent on the one background channel of ends and tool events (agentcache_sdk._events: batched, never
blocking, bounded, dropped and counted when the server is away, to every worker behind sglang-router):

- ``plan(...)``: the app's plan, any of its agent graph (agent -> the agents that may call next), its fixed
  speaking order, its turn limit and its chain of phases. It is the app's (`WorkflowContext.app`, which every
  request's tags name): sent once per app and credentials, when the app's first workflow makes its first tagged
  request (the server then knows the tenant), and again where the plan changes. Called outside a workflow, it
  waits for the app's first workflow (`app=` names the app; inside one, the current workflow's);
- ``next_agents(agents)``: the framework has decided which agent makes the workflow's next call (one), or
  that one of several will; sent at once, before that call;
- ``agent_done(agent)``: the agent's context in the workflow will not be read again (its task or phase is
  done, its last turn was known).

Each is checked as the server checks it (agentcache.trace: plan_fields, next_fields, agent_done_fields); one
that breaks the rules is not sent (counted, `invalid_events`). Agents are the ids the SDK tags requests with:
the framework's name for the agent, else its prompt's fingerprint. Outside a workflow the server knows, no
`next` or `agent_done` is sent. `configure(plan_events=False)` sends none of them; a recording still holds them.
Reference: docs/design/wire-format.md#client-events.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from agentcache.trace import EventFieldError, agent_done_fields, next_fields, plan_fields
from agentcache_sdk._config import settings
from agentcache_sdk._counters import notify, warn_once
from agentcache_sdk._events import headers, sender
from agentcache_sdk._workflow import WorkflowContext, as_id, current_agent_name, current_workflow, known_workflow

# Called with each plan, next and agent_done event (the wire's object), sent or not (the recorder).
observers: list[Callable[[dict[str, Any]], object]] = []

MAX_SENT = 4096  # (app, credentials, plan) sent; past it the record starts over (a plan sent twice is harmless)

_lock = threading.Lock()
_plans: dict[str, str] = {}  # app -> its plan's compact JSON (the latest given)
_sent: set[tuple[str, str, str | None]] = set()  # (app, plan JSON, credentials) sent


def _invalid(kind: str, exc: EventFieldError) -> None:
    warn_once(
        "invalid_events",
        f"agentcache: a {kind} event was not sent ({exc.field}: {exc}); counted in"
        " agentcache_sdk.stats()['invalid_events']",
    )


def _emit(event: dict[str, Any], authorization: str | None) -> None:
    for observer in list(observers):
        notify(observer, event)
    if settings.plan_events:
        sender.submit_event(event, headers(authorization))


def plan(
    graph: Mapping[str, Iterable[str]] | None = None,
    order: Sequence[str] | None = None,
    max_turns: int | None = None,
    chain: Sequence[tuple[str, Sequence[str]]] | None = None,
    *,
    app: str | None = None,
) -> bool:
    """Tell the server the app's plan: its agent `graph` ({agent: [agents that may call next]}), speaking `order`,
    `max_turns` and `chain` of phases ([(phase, [agents])]); any of them. `app`: the app it is the plan of
    (default: the current workflow's). False where there is no app to give it to, or the plan breaks the rules
    (the warning says which field)."""
    ctx = current_workflow()
    app = as_id(app) or (ctx.app if ctx is not None else None)
    if app is None:
        warn_once("plan_without_app", "agentcache: a plan outside a workflow with an app was not kept: name its app=")
        return False
    body: dict[str, Any] = {}
    if graph is not None:
        body["graph"] = {agent: list(dict.fromkeys(successors)) for agent, successors in graph.items()}
    if order is not None:
        body["order"] = list(order)
    if max_turns is not None:
        body["max_turns"] = max_turns
    if chain is not None:
        body["chain"] = [[phase, list(agents)] for phase, agents in chain]
    try:
        plan_fields(body)
    except EventFieldError as exc:
        _invalid("plan", exc)
        return False
    text = json.dumps(body, ensure_ascii=False, separators=(",", ":"), sort_keys=True)
    with _lock:
        _plans[app] = text
    for observer in list(observers):  # each time: a recording begun since the plan was first given takes it too
        notify(observer, {"type": "plan", "app": app, "plan": body})
    if ctx is not None and ctx.app == app and known_workflow() is ctx:
        requested(ctx)
    return True


def requested(ctx: WorkflowContext) -> None:
    """A tagged request of `ctx`'s workflow goes out: its app's plan goes first where these credentials have not
    sent it yet (called for every request: one lookup)."""
    app = ctx.app
    if app is None or not _plans:
        return
    with _lock:
        text = _plans.get(app)
        key = (app, text or "", ctx.authorization)
        if text is None or key in _sent:
            return
        if len(_sent) >= MAX_SENT:
            _sent.clear()
        _sent.add(key)
    if settings.plan_events:
        sender.submit_event({"type": "plan", "app": app, "plan": json.loads(text)}, headers(ctx.authorization))


def next_agents(agents: str | Iterable[str]) -> bool:
    """The framework has decided that `agents` (one, or any of several) make the current workflow's next call.
    False where nothing is sent: outside a workflow the server knows, or agents that break the rules."""
    ctx = known_workflow()
    if ctx is None:
        return False
    names = [agents] if isinstance(agents, str) else list(agents)
    event = {"type": "next", "workflow": ctx.id, "agents": list(dict.fromkeys(as_id(a) or "" for a in names))}
    return _checked_emit(event, next_fields, ctx.authorization)


def agent_done(agent: str | None = None) -> bool:
    """`agent`'s context in the current workflow will not be read again (default: the current agent, else the
    workflow's latest). False where nothing is sent."""
    ctx = known_workflow()
    if ctx is None:
        return False
    name = as_id(agent) or as_id(current_agent_name()) or ctx.last_agent
    event = {"type": "agent_done", "workflow": ctx.id, "agent": name}
    return _checked_emit(event, agent_done_fields, ctx.authorization)


def _checked_emit(event: dict[str, Any], check: Callable[[dict[str, Any]], object], authorization: str | None) -> bool:
    """Emit `event` if `check` (the server's check of its fields) passes; else count it as invalid, send nothing."""
    try:
        check(event)
    except EventFieldError as exc:
        _invalid(event["type"], exc)
        return False
    _emit(event, authorization)
    return True


def forget_plans() -> None:
    """Forget every plan given and sent (tests; an app that starts over)."""
    with _lock:
        _plans.clear()
        _sent.clear()
