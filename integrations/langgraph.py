"""LangGraph: the node name of each LLM request, each tool call, the graph's plan and its routers' decisions, from
LangChain's and LangGraph's own machinery.

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

The plan: when a compiled graph starts a run inside a workflow (`Pregel.stream`
and `astream`, which `invoke`, `ainvoke` and the event streams run through:
wrapped, the run unchanged), the SDK is given its nodes and edges
(agentcache_sdk.plan): plain edges, and each conditional edge's declared
targets (its path map, or its router's `Literal` return type; every node where
it declares none, as LangGraph draws it; a node's declared `destinations` for
the `Command(goto=...)` it returns), with a ToolNode (which calls no model)
passed through to the nodes after it, and the run's `recursion_limit` where the
app sets one. The decisions: each router is a traced runnable named in the
graph's branches; when one returns inside a node (before the next node's task
starts), its answer, mapped through the branch's targets and past a tool node,
is the workflow's next agents (agentcache_sdk.next_agents); so is the `goto` of
a `Command` a node with declared destinations returns, as its run ends.
"""

from __future__ import annotations

import functools
import sys
import threading
import weakref
from typing import Any

from agentcache.integrations._once import HookOnce
from agentcache_sdk import (
    add_agent_name_provider,
    current_workflow,
    next_agents,
    plan,
    tool_ended,
    tool_started,
    workflow,
)
from agentcache_sdk._counters import logger as sdk_logger

START, END = "__start__", "__end__"  # LangGraph's own names (langgraph.constants)


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


class GraphPlan:
    """A compiled graph's agents and where each may lead: nodes that call models, a ToolNode passed through."""

    def __init__(self, graph: Any) -> None:
        from langgraph.prebuilt import ToolNode

        builder = graph.builder
        self.nodes = list(builder.nodes)
        self.tools = {n for n, spec in builder.nodes.items() if isinstance(spec.runnable, ToolNode)}
        direct: dict[str, set[str]] = {n: set() for n in [START, *self.nodes]}
        for start, end in builder.edges:
            direct.setdefault(start, set()).add(end)
        for starts, end in builder.waiting_edges:
            for start in starts:
                direct.setdefault(start, set()).add(end)
        # A node that routes by returning Command(goto=...) declares where it may go (its `destinations`).
        self.commanding: set[str] = set()
        for node, spec in builder.nodes.items():
            if spec.ends:
                self.commanding.add(node)
                direct[node].update(spec.ends)  # a tuple of nodes, or a dict keyed by them
        # (node, router name) -> the router's declared answers and their nodes (None: any node)
        self.branches: dict[tuple[str, str], dict[Any, str] | None] = {}
        for node, branches in builder.branches.items():
            for name, branch in branches.items():
                self.branches[(node, name)] = branch.ends
                direct.setdefault(node, set()).update(branch.ends.values() if branch.ends else self.nodes)
        self._direct = direct

    def after(self, targets: Any) -> list[str]:
        """The nodes that call next when `targets` run: a tool node's own successors in its place, END left out."""
        out: dict[str, None] = {}
        seen: set[str] = set()
        stack = list(targets)
        while stack:
            node = stack.pop(0)
            if node in seen or node in (START, END):
                continue
            seen.add(node)
            if node in self.tools:
                stack.extend(sorted(self._direct.get(node, ())))
            else:
                out[node] = None
        return list(out)

    def graph(self) -> dict[str, list[str]]:
        """Each agent (a node that is no ToolNode) -> the agents that may call next."""
        return {n: self.after(sorted(self._direct.get(n, ()))) for n in self.nodes if n not in self.tools}

    def commanded(self, command: Any) -> list[str] | None:
        """The nodes a node's `Command(goto=...)` sends the run to (None: it goes nowhere in this graph)."""
        goto = command.goto
        if command.graph is not None or not goto:  # to the parent graph, or an update alone
            return None
        goto = [goto] if isinstance(goto, str) or not isinstance(goto, (list, tuple)) else goto
        return self.after([g if isinstance(g, str) else getattr(g, "node", None) for g in goto])

    def decided(self, node: str, router: str, answer: Any) -> list[str] | None:
        """The nodes a router's `answer` sends the run to, as LangGraph maps it (BranchSpec._finish)."""
        if (node, router) not in self.branches:
            return None
        ends = self.branches[(node, router)]
        answers = answer if isinstance(answer, (list, tuple)) else [answer]
        targets = []
        for a in answers:
            target = a if isinstance(a, str) else getattr(a, "node", None)  # a Send names its node
            targets.append(ends.get(target, target) if ends and target in ends else target)
        return self.after([t for t in targets if isinstance(t, str)])


_plans: weakref.WeakKeyDictionary[Any, GraphPlan] = weakref.WeakKeyDictionary()
# (node, router name) -> the plan of the graph that has it; (node, node): a node that routes by Command
_routers: dict[tuple[str, str], GraphPlan] = {}


def _run_starts(graph: Any, config: Any) -> None:
    """A compiled graph starts a run: inside a workflow, and not as a subgraph's task, its plan is given."""
    if current_workflow() is None or not hasattr(graph, "builder"):
        return
    if "__pregel_task_id" in ((config or {}).get("configurable") or {}):  # run as a parent graph's node
        return
    graph_plan = _plans.get(graph)
    if graph_plan is None:
        graph_plan = _plans[graph] = GraphPlan(graph)
        for key in graph_plan.branches:
            _routers[key] = graph_plan
        for node in graph_plan.commanding:
            _routers[(node, node)] = graph_plan  # the node's own run: its Command is its decision
    limit = (config or {}).get("recursion_limit") or (getattr(graph, "config", None) or {}).get("recursion_limit")
    from langgraph._internal._config import DEFAULT_RECURSION_LIMIT

    explicit = isinstance(limit, int) and type(limit) is not type(DEFAULT_RECURSION_LIMIT)
    plan(graph=graph_plan.graph(), max_turns=limit if explicit else None)


def _planning(run: Any) -> Any:
    @functools.wraps(run)
    def planned(self: Any, input: Any, config: Any = None, **kwargs: Any) -> Any:
        try:
            _run_starts(self, config)
        except Exception:  # an integration bug must not break the run
            sdk_logger.debug("agentcache: reading a LangGraph graph's plan failed", exc_info=True)
        return run(self, input, config, **kwargs)  # the run's own (async) generator, as it was

    return planned


def _decisions_handler() -> Any:
    """The callback handler that sends each router's decision (made once LangChain is loaded)."""
    from langchain_core.callbacks import BaseCallbackHandler

    class RouterDecisions(BaseCallbackHandler):
        run_inline = True  # in the router's own context (its workflow), before the node's task ends
        ignore_llm = ignore_retriever = ignore_chat_model = ignore_custom_event = ignore_agent = True

        def __init__(self) -> None:
            self._runs: dict[Any, tuple[str, str]] = {}  # run id -> (node, router) of a router running
            self._lock = threading.Lock()
            self._last_command: Any = None  # the Command last read (a node's nested runs all end with it)

        def on_chain_start(self, serialized: Any, inputs: Any, *, run_id: Any, **kwargs: Any) -> None:
            node = (kwargs.get("metadata") or {}).get("langgraph_node")
            key = (node, kwargs.get("name"))
            if node is not None and key in _routers and current_workflow() is not None:
                with self._lock:
                    self._runs[run_id] = key

        def on_chain_end(self, outputs: Any, *, run_id: Any, **kwargs: Any) -> None:
            if not self._runs:
                return
            with self._lock:
                key = self._runs.pop(run_id, None)
            if key is None:
                return
            graph_plan = _routers.get(key)
            if graph_plan is None:
                return
            if key[0] == key[1]:  # a node's own run: a Command it returns decides (its inner runs end with it too)
                if type(outputs).__name__ != "Command" or outputs is self._last_command:
                    return
                self._last_command = outputs
                agents = graph_plan.commanded(outputs)
            else:
                agents = graph_plan.decided(*key, outputs)
            if agents:
                next_agents(agents)

        def on_chain_error(self, error: BaseException, *, run_id: Any, **kwargs: Any) -> None:
            with self._lock:
                self._runs.pop(run_id, None)

    return RouterDecisions()


def _hook() -> bool:
    """Add the tool-call and router handlers to every LangChain run, and have LangGraph's runs give their graph's
    plan; False when LangChain is not installed."""
    try:
        from contextvars import ContextVar

        from langchain_core.tracers.context import register_configure_hook
    except ImportError:
        return False
    # Context variables whose default is the handler (one, shared on purpose: a value set instead would miss
    # threads started later): LangChain adds it to every callback manager it makes.
    handler = ContextVar("agentcache_tool_pauses", default=_tool_pause_handler())  # noqa: B039
    register_configure_hook(handler, inheritable=True)
    decisions = ContextVar("agentcache_router_decisions", default=_decisions_handler())  # noqa: B039
    register_configure_hook(decisions, inheritable=True)
    try:
        from langgraph.pregel import Pregel
    except ImportError:  # LangChain without LangGraph
        return True
    Pregel.stream = _planning(Pregel.stream)  # type: ignore[method-assign]
    Pregel.astream = _planning(Pregel.astream)  # type: ignore[method-assign]
    return True


_hooks = HookOnce("langchain_core", _hook)
register = _hooks.install

add_agent_name_provider(langgraph_node, on_workflow_start=_hooks.if_loaded)
_hooks.if_loaded()

__all__ = ["GraphPlan", "langgraph_node", "register", "workflow"]
