"""CrewAI: the role of the agent making each LLM request, from CrewAI's before-LLM-call hook.

CrewAI runs that hook inline, in the thread and context of the request about
to be sent, so a context variable set there is what the SDK's request hook
reads a moment later. The hook is registered when this module is imported
(which imports CrewAI: only CrewAI apps import this module).
"""

from __future__ import annotations

import contextvars
from typing import Any

from agentcache_sdk import add_agent_name_provider, workflow

_role: contextvars.ContextVar[str | None] = contextvars.ContextVar("agentcache_crewai_role", default=None)
_registered = False


def _before_llm_call(context: Any) -> None:
    agent = getattr(context, "agent", None)
    role = getattr(agent, "role", None)
    _role.set(role if isinstance(role, str) else None)
    return None


def crewai_role() -> str | None:
    return _role.get()


def register() -> bool:
    """Register the hook with CrewAI (idempotent); False when CrewAI is not installed."""
    global _registered
    if _registered:
        return True
    try:
        from crewai.hooks import register_before_llm_call_hook
    except ImportError:
        return False
    register_before_llm_call_hook(_before_llm_call)
    _registered = True
    return True


add_agent_name_provider(crewai_role)
register()

__all__ = ["crewai_role", "register", "workflow"]
