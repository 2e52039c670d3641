"""CrewAI: the role of the agent making each LLM request, each tool call, a crew's plan and its task changes, from
CrewAI's global hooks and events.

CrewAI runs its before-LLM-call hook inline, in the thread and context of the
request about to be sent, so a context variable set there is what the SDK's
request hook reads a moment later. Its before- and after-tool-call hooks run
the same way around each tool call (the after hook also for a call that failed
or was blocked): they report the call to the SDK as the agent's (its role's)
tool pause. CrewAI gives no call id; the SDK joins a call to the pause of the
answer that asked for it by the agent. Importing this module never imports
CrewAI: the hooks are registered once the app has loaded CrewAI, at this
import or when a workflow starts, so before CrewAI's first LLM call inside one
(an agent copies the registered hooks when it first runs).
"""

from __future__ import annotations

import contextvars
import weakref
from typing import Any

from agentcache.integrations._once import HookOnce
from agentcache_sdk import add_agent_name_provider, agent_done, next_agents, plan, tool_ended, tool_started, workflow
from agentcache_sdk._counters import logger as sdk_logger

_role: contextvars.ContextVar[str | None] = contextvars.ContextVar("agentcache_crewai_role", default=None)


def _before_llm_call(context: Any) -> None:
    agent = getattr(context, "agent", None)
    role = getattr(agent, "role", None)
    _role.set(role if isinstance(role, str) else None)
    crew = getattr(context, "crew", None)
    if crew is not None and crew not in _crews:
        _crews.add(crew)
        try:
            crew_plan = plan_of(crew)
            if crew_plan is not None:
                plan(**crew_plan)
        except Exception:  # an integration bug must not break the crew
            sdk_logger.debug("agentcache: reading a CrewAI crew's plan failed", exc_info=True)
    return None


_crews: weakref.WeakSet[Any] = weakref.WeakSet()  # crews whose plan was given


def _role_name(agent: Any) -> str | None:
    role = getattr(agent, "role", None)
    return role if isinstance(role, str) and role else None


def _hierarchical(crew: Any) -> bool:
    from crewai import Process

    return crew.process == Process.hierarchical


def plan_of(crew: Any) -> dict[str, Any] | None:
    """A crew's plan, as the SDK's plan() takes it; None where it says no more than its one task."""
    if _hierarchical(crew):
        manager = _role_name(crew.manager_agent)
        members = list(dict.fromkeys(r for r in map(_role_name, crew.agents) if r is not None and r != manager))
        if manager is None or not members:
            return None
        return {"graph": {manager: members, **{m: [manager] for m in members}}}
    tasks = [(getattr(t, "name", None) or f"task {i + 1}", _role_name(t.agent)) for i, t in enumerate(crew.tasks)]
    if len(tasks) < 2 or any(role is None for _, role in tasks):
        return None
    roles = [role for _, role in tasks]
    out: dict[str, Any] = {"chain": [(name, [role]) for name, role in tasks]}
    if len(set(roles)) == len(roles):
        out["order"] = roles
    return out


def _task_completed(source: Any, event: Any) -> None:
    """A task completed: its agent's context is done; in a sequential crew, the next task's agent calls next."""
    try:
        _completed(getattr(event, "task", None) or source)
    except Exception:  # an integration bug must not break the crew
        sdk_logger.debug("agentcache: reading a CrewAI task's completion failed", exc_info=True)


def _completed(task: Any) -> None:
    role = _role_name(getattr(task, "agent", None))
    crew = next((c for c in list(_crews) if any(t is task for t in c.tasks)), None)
    if crew is not None and not _hierarchical(crew):
        tasks = list(crew.tasks)
        at = next(i for i, t in enumerate(tasks) if t is task)
        following = _role_name(tasks[at + 1].agent) if at + 1 < len(tasks) else None
        if following is not None:
            next_agents(following)
    if role is not None:
        agent_done(role)


def _role_of(context: Any) -> str | None:
    role = getattr(getattr(context, "agent", None), "role", None)
    return role if isinstance(role, str) else None


def _before_tool_call(context: Any) -> None:
    tool = getattr(context, "tool_name", None) or "tool"
    tool_started(tool, _role_of(context))
    if tool in _DELEGATION:  # a manager's (or agent's) choice of the coworker who works next
        coworker = (getattr(context, "tool_input", None) or {}).get("coworker")
        if isinstance(coworker, str) and coworker:
            next_agents(coworker)
    return None  # the call goes ahead


def _after_tool_call(context: Any) -> None:
    tool_ended(getattr(context, "tool_name", None) or "tool", _role_of(context))
    return None  # the result as the tool gave it


def crewai_role() -> str | None:
    return _role.get()


_DELEGATION: set[str] = set()  # CrewAI's delegation tools' names, as its hooks give them


def _hook() -> bool:
    """Register the hooks with CrewAI, importing it; False when CrewAI is not installed."""
    try:
        from crewai.events import TaskCompletedEvent, crewai_event_bus
        from crewai.hooks import (
            register_after_tool_call_hook,
            register_before_llm_call_hook,
            register_before_tool_call_hook,
        )
        from crewai.utilities.string_utils import sanitize_tool_name
    except ImportError:
        return False
    _DELEGATION.update(sanitize_tool_name(n) for n in ("Delegate work to coworker", "Ask question to coworker"))
    register_before_llm_call_hook(_before_llm_call)
    register_before_tool_call_hook(_before_tool_call)
    register_after_tool_call_hook(_after_tool_call)
    crewai_event_bus.on(TaskCompletedEvent)(_task_completed)
    return True


_hooks = HookOnce("crewai", _hook)
register = _hooks.install

add_agent_name_provider(crewai_role, on_workflow_start=_hooks.if_loaded)
_hooks.if_loaded()

__all__ = ["crewai_role", "plan_of", "register", "workflow"]
