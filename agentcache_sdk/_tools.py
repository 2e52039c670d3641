"""Tool calls: telling the server when an agent starts waiting on a tool, and when the wait is over.

While a tool runs (tests, a search: seconds, sometimes minutes) the agent's
path in the cache (its prompt and answer) is what its next call reads; the
server keeps it through the pause when told of it. Three sources feed one book
of open pauses per workflow:

- a plain app (openai SDK, httpx): an answer that asks for tools (finish reason
  ``tool_calls``, or tool calls in its message) starts a pause for the agent
  that asked, named by the answer's tools (joined with ``+`` when several);
  the agent's next request in the workflow ends it;
- a framework integration (integrations/): the framework's own callbacks
  report each tool call's start and end, with the call id where the framework
  gives one. A call the answer announced already (the same call id, else the
  same agent) joins that answer's pause instead of starting another: one pause
  per answer, ended when the last of its calls ends (or at the agent's next
  request, whichever comes first);
- the app itself: ``with tool_call("pytest"): ...``, or `tool_started` and
  `tool_ended`.

Each start and end is one event, ``{"type": "tool_start" | "tool_end",
"workflow", "agent", "tool"}``, validated as the server validates it
(`agentcache.trace.tool_fields`) and sent in the background with the
workflow's end events (agentcache_sdk._events). Outside a workflow, or in one
that has made no tagged request yet (the server does not know it), nothing is
sent. A workflow's end closes its open pauses without an event: the server
drops them with the workflow. The agent is the id the server knows the agent's
requests by: the framework's name for it, else the fingerprint of its fixed
prompt; for a tool started with no agent named and no framework name, the
agent of the workflow's latest request.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from agentcache.tags import MAX_ID_CHARS
from agentcache.trace import EventFieldError, tool_fields
from agentcache_sdk._config import settings
from agentcache_sdk._counters import notify, warn_once
from agentcache_sdk._events import headers, sender
from agentcache_sdk._workflow import WorkflowContext, as_id, current_agent_name, known_workflow

# Called with (event type, workflow, agent, tool) for each tool event, sent or not (the recorder).
observers: list[Callable[[str, str, str, str], object]] = []


@dataclass
class Pause:
    """One agent waiting on the tool call(s) of one answer, or on one call a framework or the app reported."""

    agent: str
    tool: str  # the name its events carry
    announced: Counter[str] = field(default_factory=Counter)  # calls an answer asked for, not reported started
    running: Counter[str] = field(default_factory=Counter)  # calls reported started, not yet ended
    call_ids: dict[str, str] = field(default_factory=dict)  # call id -> tool name, of the calls above

    def over(self) -> bool:
        return not +self.announced and not +self.running


def _emit(ctx: WorkflowContext, kind: str, workflow: str, agent: str, tool: str) -> None:
    event = {"type": kind, "workflow": workflow, "agent": agent, "tool": tool}
    try:
        tool_fields(event)
    except EventFieldError as exc:  # a name cut to a valid id leaves only an empty one invalid
        warn_once(
            "invalid_events",
            f"agentcache: a {kind} event was not sent ({exc}); counted in agentcache_sdk.stats()['invalid_events']",
        )
        return
    for observer in list(observers):
        notify(observer, kind, workflow, agent, tool)
    if settings.tool_events:
        sender.submit_event(event, headers(ctx.authorization))


def _agent(ctx: WorkflowContext, agent: str | None) -> str | None:
    return as_id(agent) or as_id(current_agent_name()) or ctx.last_agent


# -- plain apps: answers that ask for tools, and the asking agent's next request


def tool_calls_of(answer: Any) -> list[tuple[str | None, str]] | None:
    """(call id, tool name) of each tool call an OpenAI-style answer asks for; None when it asks for none."""
    choices = answer.get("choices") if isinstance(answer, Mapping) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], Mapping):
        return None
    choice = choices[0]
    message = choice.get("message")
    message = message if isinstance(message, Mapping) else {}
    calls: list[tuple[str | None, str]] = []
    for call in message.get("tool_calls") or ():
        function = call.get("function") if isinstance(call, Mapping) else None
        name = function.get("name") if isinstance(function, Mapping) else None
        call_id = call.get("id")
        calls.append((call_id if isinstance(call_id, str) and call_id else None, as_id(name) or "tool"))
    legacy = message.get("function_call")  # the openai API's older form, one call
    if not calls and isinstance(legacy, Mapping):
        calls.append((None, as_id(legacy.get("name")) or "tool"))
    if not calls and choice.get("finish_reason") == "tool_calls":
        calls.append((None, "tool"))
    return calls or None


def answered(workflow: str, agent: str, answer: Any) -> None:
    """An answer to `agent`'s request in `workflow` arrived: a pause starts if it asks for tools."""
    calls = tool_calls_of(answer)
    ctx = known_workflow()
    if calls is None or ctx is None:
        return
    names = [name for _, name in calls]
    tool = "+".join(dict.fromkeys(names))[:MAX_ID_CHARS]
    ids = {call_id: name for call_id, name in calls if call_id}
    with ctx._lock:
        if ctx.id != workflow or ctx.ended:
            return  # an app's own tags, or a workflow ended meanwhile
        if any(ids.keys() & p.call_ids.keys() for p in ctx.pauses):
            return  # a framework reported these calls before the answer was read whole
        ctx.pauses.append(Pause(agent, tool, announced=Counter(names), call_ids=ids))
    _emit(ctx, "tool_start", workflow, agent, tool)


def called_again(ctx: WorkflowContext, agent: str) -> None:
    """`agent` makes its next request in `ctx`'s workflow: its open pauses are over (sent before the request)."""
    with ctx._lock:
        if not ctx.pauses:
            return
        over = [p for p in ctx.pauses if p.agent == agent]
        ctx.pauses[:] = [p for p in ctx.pauses if p.agent != agent]
        workflow = ctx.id
    for pause in over:
        _emit(ctx, "tool_end", workflow, pause.agent, pause.tool)


# -- frameworks and the app: each tool call's start and end


def tool_started(tool: str, agent: str | None = None, call_id: str | None = None) -> bool:
    """Say that `agent` (default: the current agent) now waits on `tool`; False where nothing is sent (outside a
    workflow, or a call an answer announced already, which joins that answer's pause). `call_id`: the
    framework's id of the call (an OpenAI tool call id), which `tool_ended` names again."""
    ctx = known_workflow()
    tool_id = as_id(tool) or "tool"
    if ctx is None:
        return False
    with ctx._lock:
        name = _agent(ctx, agent)
        pause = _announcing(ctx, call_id, name, tool_id)
        if pause is not None:
            announced = pause.call_ids.get(call_id or "") or next(
                (n for n in (tool_id, *pause.announced) if pause.announced[n] > 0), tool_id
            )
            pause.announced[announced] -= 1
            pause.running[announced] += 1
            if call_id:
                pause.call_ids[call_id] = announced
            return False
        if name is None:
            return False
        ctx.pauses.append(
            Pause(name, tool_id, running=Counter([tool_id]), call_ids={call_id: tool_id} if call_id else {})
        )
        workflow = ctx.id
    _emit(ctx, "tool_start", workflow, name, tool_id)
    return True


def _announcing(ctx: WorkflowContext, call_id: str | None, agent: str | None, tool: str) -> Pause | None:
    """The open pause of an answer that announced this call: by its id, else the agent's with the tool announced,
    else the agent's with any call announced (a framework may name a tool otherwise than the answer did)."""
    if call_id:
        for pause in ctx.pauses:
            if pause.announced[pause.call_ids.get(call_id, "")] > 0:
                return pause
    mine = [p for p in ctx.pauses if p.agent == agent and +p.announced]
    return next((p for p in mine if p.announced[tool] > 0), mine[0] if mine else None)


def tool_ended(tool: str, agent: str | None = None, call_id: str | None = None) -> bool:
    """Say that a tool call `tool_started` reported is over; True when that ends its pause (an event is sent)."""
    ctx = known_workflow()
    tool_id = as_id(tool) or "tool"
    if ctx is None:
        return False
    with ctx._lock:
        name = _agent(ctx, agent)
        found = _running(ctx, call_id, name, tool_id)
        if found is None:
            return False  # over already: the agent's next request ended it, or its workflow ended
        pause, running = found
        pause.running[running] -= 1
        pause.call_ids.pop(call_id or "", None)
        if not pause.over():
            return False
        ctx.pauses.remove(pause)
        workflow = ctx.id
    _emit(ctx, "tool_end", workflow, pause.agent, pause.tool)
    return True


def _running(ctx: WorkflowContext, call_id: str | None, agent: str | None, tool: str) -> tuple[Pause, str] | None:
    """The open pause a call reported started belongs to, and the tool name it runs under there."""
    if call_id:
        for pause in ctx.pauses:
            name = pause.call_ids.get(call_id)
            if name is not None and pause.running[name] > 0:
                return pause, name
        return None
    mine = [p for p in ctx.pauses if p.agent == agent and +p.running]
    for pause in mine:
        if pause.running[tool] > 0:
            return pause, tool
    if mine:
        return mine[0], next(n for n in mine[0].running if mine[0].running[n] > 0)
    return None


class tool_call:  # noqa: N801 - a context manager, spelled like a function
    """Report one tool call around the block that runs it: `with tool_call("pytest"): run_tests()`.

    The agent defaults to the framework's name for the current agent, else the agent of the workflow's latest
    request. Outside a workflow it does nothing. Also `async with`."""

    def __init__(self, tool: str, agent: str | None = None):
        self.tool, self.agent = tool, agent
        self._call_id = f"ac-{uuid.uuid4().hex[:16]}"

    def __enter__(self) -> tool_call:
        tool_started(self.tool, self.agent, self._call_id)
        return self

    def __exit__(self, *exc: object) -> None:
        tool_ended(self.tool, self.agent, self._call_id)

    async def __aenter__(self) -> tool_call:
        return self.__enter__()

    async def __aexit__(self, *exc: object) -> None:
        self.__exit__(*exc)
