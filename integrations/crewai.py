"""CrewAI: the role of the agent making each LLM request, and each tool call, from CrewAI's global hooks.

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
from typing import Any

from agentcache.integrations._once import HookOnce
from agentcache_sdk import add_agent_name_provider, tool_ended, tool_started, workflow

_role: contextvars.ContextVar[str | None] = contextvars.ContextVar("agentcache_crewai_role", default=None)


def _before_llm_call(context: Any) -> None:
    agent = getattr(context, "agent", None)
    role = getattr(agent, "role", None)
    _role.set(role if isinstance(role, str) else None)
    return None


def _role_of(context: Any) -> str | None:
    role = getattr(getattr(context, "agent", None), "role", None)
    return role if isinstance(role, str) else None


def _before_tool_call(context: Any) -> None:
    tool_started(getattr(context, "tool_name", None) or "tool", _role_of(context))
    return None  # the call goes ahead


def _after_tool_call(context: Any) -> None:
    tool_ended(getattr(context, "tool_name", None) or "tool", _role_of(context))
    return None  # the result as the tool gave it


def crewai_role() -> str | None:
    return _role.get()


def _hook() -> bool:
    """Register the hooks with CrewAI, importing it; False when CrewAI is not installed."""
    try:
        from crewai.hooks import (
            register_after_tool_call_hook,
            register_before_llm_call_hook,
            register_before_tool_call_hook,
        )
    except ImportError:
        return False
    register_before_llm_call_hook(_before_llm_call)
    register_before_tool_call_hook(_before_tool_call)
    register_after_tool_call_hook(_after_tool_call)
    return True


_hooks = HookOnce("crewai", _hook)
register = _hooks.install

add_agent_name_provider(crewai_role, on_workflow_start=_hooks.if_loaded)
_hooks.if_loaded()

__all__ = ["crewai_role", "register", "workflow"]
