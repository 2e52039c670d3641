"""agentcache SDK: workflow-aware KV caching for an existing multi-agent app, with one decorator.

    import agentcache_sdk as ac

    ac.configure(base_url="http://127.0.0.1:30000")

    @ac.workflow
    def solve(task): ...            # every LLM request inside is tagged; leaving ends the workflow

    with ac.tool_call("pytest"):    # inside a workflow: the agent waits on a tool (the server keeps its path)
        run_tests()

    ac.plan(graph={"planner": ["coder"], "coder": ["tester"]})   # the app's plan, once
    ac.next_agents("coder")         # the app decided who calls next; ac.agent_done("planner"): read no more

Importing the package installs the request hooks (openai SDK and httpx, as
the app imports them: agentcache_sdk itself imports neither) and carries the
workflow into thread pools; both only act inside a workflow, and the hooks
only touch requests to the configured server. Behind `agentcache
serve --workers N` each request goes to the worker the workflow-aware routing
chooses (``configure(routing="workflow-affinity")`` keeps whole workflows on
one worker instead); `routing_stats()` says what it did. An answer that asks
for tools starts a tool pause for its agent, which its next request ends
(agentcache_sdk._tools); the framework integrations report each tool call, and
the framework's plan and decisions (agentcache_sdk._plan).
"""

from agentcache_sdk._answers import usage
from agentcache_sdk._config import Settings, configure, settings
from agentcache_sdk._counters import counters
from agentcache_sdk._events import flush
from agentcache_sdk._hooks import install as _install_hooks
from agentcache_sdk._plan import agent_done, next_agents, plan
from agentcache_sdk._record import Recorder, record
from agentcache_sdk._routing import routing_stats
from agentcache_sdk._thread_pools import carry_into_thread_pools as _carry_into_thread_pools
from agentcache_sdk._tools import tool_call, tool_ended, tool_started
from agentcache_sdk._workflow import (
    WorkflowContext,
    add_agent_name_provider,
    agent_name,
    current_agent_name,
    current_workflow,
    end_workflow,
    stats,
    workflow,
)

_install_hooks()
_carry_into_thread_pools()

__all__ = [
    "Recorder",
    "Settings",
    "WorkflowContext",
    "add_agent_name_provider",
    "agent_done",
    "agent_name",
    "configure",
    "counters",
    "current_agent_name",
    "current_workflow",
    "end_workflow",
    "flush",
    "next_agents",
    "plan",
    "record",
    "routing_stats",
    "settings",
    "stats",
    "tool_call",
    "tool_ended",
    "tool_started",
    "usage",
    "workflow",
]
