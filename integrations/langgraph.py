"""LangGraph: the node name of each LLM request, from the runnable config LangChain keeps in a context variable."""

from __future__ import annotations

import sys

from agentcache_sdk import add_agent_name_provider, workflow


def langgraph_node() -> str | None:
    config = sys.modules.get("langchain_core.runnables.config")
    if config is None:
        return None
    current = config.var_child_runnable_config.get() or {}
    node = (current.get("metadata") or {}).get("langgraph_node")
    return node if isinstance(node, str) else None


add_agent_name_provider(langgraph_node)

__all__ = ["langgraph_node", "workflow"]
