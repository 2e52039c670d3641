"""LangGraph: the node name of each LLM request, and each tool call, from LangChain's own machinery.

The node name comes from the runnable config LangChain keeps in a context
variable. Tool calls come from LangChain's callbacks (`on_tool_start`, then
`on_tool_end` or `on_tool_error`, which LangGraph's ToolNode and every
LangChain tool fire): one handler joins every run without the app passing it,
through LangChain's documented `register_configure_hook` (as LangSmith's
tracer does). It is registered once the app has loaded LangChain, at this
import or when a workflow starts; importing this module never imports it.

A call the model asked for (it carries the call's id) is the asking agent's
pause, whichever node runs the tool: the SDK matches the id with the answer
that asked for it, else takes the workflow's latest agent. A tool a node
invokes itself (no call id) is that node's pause.
"""

from __future__ import annotations

import sys
import threading
from typing import Any

from agentcache.integrations._once import HookOnce
from agentcache_sdk import add_agent_name_provider, current_workflow, tool_ended, tool_started, workflow


def langgraph_node() -> str | None:
    config = sys.modules.get("langchain_core.runnables.config")
    if config is None:
        return None
    current = config.var_child_runnable_config.get() or {}
    node = (current.get("metadata") or {}).get("langgraph_node")
    return node if isinstance(node, str) else None


def _tool_pause_handler() -> Any:
    """The callback handler that reports tool calls to the SDK (made once LangChain is loaded)."""
    from langchain_core.callbacks import BaseCallbackHandler

    class ToolPauses(BaseCallbackHandler):
        run_inline = True  # in the tool's own context (its workflow), never in an executor
        ignore_llm = ignore_chain = ignore_retriever = ignore_chat_model = ignore_custom_event = True
        # `ignore_agent` stays False: LangChain skips tool callbacks of handlers that ignore agents.

        def __init__(self) -> None:
            self._runs: dict[Any, tuple[str, str | None, str | None]] = {}  # run id -> (tool, agent, call id)
            self._lock = threading.Lock()

        def on_tool_start(self, serialized: dict[str, Any], input_str: str, *, run_id: Any, **kwargs: Any) -> None:
            ctx = current_workflow()
            if ctx is None:
                return
            tool = (serialized or {}).get("name") or kwargs.get("name") or "tool"
            call_id = kwargs.get("tool_call_id")
            call_id = call_id if isinstance(call_id, str) and call_id else None
            agent = ctx.last_agent if call_id else None  # asked for by a model: its agent waits, not the tool node
            with self._lock:
                self._runs[run_id] = (tool, agent, call_id)
            tool_started(tool, agent, call_id)

        def on_tool_end(self, output: Any, *, run_id: Any, **kwargs: Any) -> None:
            self._ended(run_id)

        def on_tool_error(self, error: BaseException, *, run_id: Any, **kwargs: Any) -> None:
            self._ended(run_id)

        def _ended(self, run_id: Any) -> None:
            with self._lock:
                run = self._runs.pop(run_id, None)
            if run is not None:
                tool_ended(*run)

    return ToolPauses()


def _hook() -> bool:
    """Add the tool-call handler to every LangChain run; False when LangChain is not installed."""
    try:
        from contextvars import ContextVar

        from langchain_core.tracers.context import register_configure_hook
    except ImportError:
        return False
    # A context variable whose default is the handler (one, shared on purpose: a value set instead would miss
    # threads started later): LangChain adds it to every callback manager it makes.
    handler = ContextVar("agentcache_tool_pauses", default=_tool_pause_handler())  # noqa: B039
    register_configure_hook(handler, inheritable=True)
    return True


_hooks = HookOnce("langchain_core", _hook)
register = _hooks.install

add_agent_name_provider(langgraph_node, on_workflow_start=_hooks.if_loaded)
_hooks.if_loaded()

__all__ = ["langgraph_node", "register", "workflow"]
