"""Agents that call tools between their LLM calls, with the tool calls in the trace (tool_start, tool_end).

Each workflow is one task for a worker agent (default: a coder or a researcher, by coin) that runs a tool
loop, as agent frameworks do: its call's answer asks for a tool, the framework runs the tool (a pause of
seconds, sometimes minutes: the trace's tool_start and tool_end), then calls the same agent again with its
previous prompt, its answer and the tool's result appended. After each tool call another follows with
probability `loop_prob` (default 0.75: four tool calls a task on average, at most MAX_TOOL_CALLS); then the
worker answers without a tool, a reviewer reads the whole history once, and the workflow ends. Arrivals are
Poisson (`rate`), so many workflows are in flight and other workflows' requests come during each pause.

A tool's duration is log-normal: ``median * exp(shape * N(0, 1))``, per tool, so most calls take seconds and
a tail takes minutes (p90 = median * e^(1.28 shape), p99 = median * e^(2.33 shape)). The parameters are
set from what such tools take in agent runs (a search API answers in a second or two, a page fetch in a few,
a test suite in tens of seconds and sometimes minutes, a deployment in minutes), not tuned to make any
policy win; the `tool_s` knob is not read. A tool's result is `result` times the `tool_tokens` knob, +-60%.

`held_out`: other workers with other tools, durations and result sizes (an analyst and an operator), for
checking that what a policy learns on the default carries over. `hints`: the graph and the most calls as the
plan, and the next caller once an answer is out (the worker after asking for a tool, the reviewer after the
worker's last answer).
"""

from __future__ import annotations

import math
import random
from statistics import NormalDist
from typing import NamedTuple

from agentcache.trace import Plan, Segment, ToolEnd, ToolStart, Trace
from agentcache.workloads.common import (
    Agent,
    Conversation,
    GenConfig,
    assemble,
    jitter,
    make_agents,
    start_conversations,
)

FAMILY = "tool-use"
DEFAULT_LOOP_PROB = 0.75
MAX_TOOL_CALLS = 12
REVIEWER = "reviewer"


class Tool(NamedTuple):
    name: str
    median_s: float  # the duration's median
    shape: float  # the standard deviation of its logarithm
    result: float  # mean result size, in multiples of the tool_tokens knob


def duration_quantile(tool: Tool, q: float) -> float:
    """The q-quantile of `tool`'s duration (q in (0, 1))."""
    return tool.median_s * math.exp(tool.shape * NormalDist().inv_cdf(q))


# Worker agent -> its tools.
TOOLS: dict[str, tuple[Tool, ...]] = {
    "coder": (
        Tool("read_file", 1.0, 0.5, 2.0),
        Tool("shell", 3.0, 1.2, 0.5),
        Tool("run_tests", 20.0, 1.0, 2.5),
    ),
    "researcher": (
        Tool("web_search", 2.0, 0.6, 1.5),
        Tool("fetch_page", 4.0, 0.8, 4.0),
        Tool("python", 6.0, 1.0, 0.5),
    ),
}
HELD_OUT_TOOLS: dict[str, tuple[Tool, ...]] = {
    "analyst": (
        Tool("sql_query", 1.5, 0.9, 1.5),
        Tool("notebook", 15.0, 1.1, 1.0),
        Tool("dashboard_export", 45.0, 0.7, 0.3),
    ),
    "operator": (
        Tool("kubectl", 2.5, 1.0, 1.0),
        Tool("log_search", 5.0, 1.2, 3.0),
        Tool("deploy", 90.0, 0.6, 0.5),
    ),
}


def tools_of(cfg: GenConfig) -> dict[str, tuple[Tool, ...]]:
    return HELD_OUT_TOOLS if cfg.held_out else TOOLS


def call_tool(conv: Conversation, agent: Agent, tool: Tool) -> None:
    """`agent`'s last answer asked for `tool`: the pause (tool_start, the tool's run, tool_end), then its result
    joins the history that the agent's next call re-sends."""
    conv.events.append(ToolStart(round(conv.ts, 3), conv.workflow, agent.name, tool.name))
    conv.ts += conv.rng.lognormvariate(math.log(tool.median_s), tool.shape)
    conv.events.append(ToolEnd(round(conv.ts, 3), conv.workflow, agent.name, tool.name))
    result = jitter(conv.rng, tool.result * conv.cfg.tool_tokens, 0.6)
    conv.history.append(Segment(f"tool/{conv.workflow}/{conv.calls}", result))
    conv.ts += conv.rng.uniform(0.05, 0.3)  # the framework appends the result and calls the agent again


def generate(cfg: GenConfig) -> Trace:
    rng = random.Random(cfg.seed)
    p_again = DEFAULT_LOOP_PROB if cfg.loop_prob is None else cfg.loop_prob
    tools = tools_of(cfg)
    workers = sorted(tools)
    agents = make_agents(FAMILY, [*workers, REVIEWER], cfg, rng)
    conversations = start_conversations(FAMILY, cfg, rng)
    for conv in conversations:
        worker = agents[conv.rng.choice(workers)]
        for step in range(MAX_TOOL_CALLS):
            conv.call(worker)  # its answer asks for a tool
            conv.decided(worker.name)  # the tool's result goes back to it
            call_tool(conv, worker, conv.rng.choice(tools[worker.name]))
            if step == MAX_TOOL_CALLS - 1 or conv.rng.random() >= p_again:
                break
        conv.call(worker)  # the answer, with no tool
        conv.decided(REVIEWER)
        conv.call(agents[REVIEWER])
        conv.end()
    graph = {**{w: [w, REVIEWER] for w in workers}, REVIEWER: []}
    plan = Plan(graph={a: tuple(b) for a, b in graph.items()}, max_turns=MAX_TOOL_CALLS + 2)
    kinds = "; ".join(
        f"{w}: " + ", ".join(f"{t.name} (median {t.median_s:g} s, shape {t.shape:g})" for t in tools[w])
        for w in workers
    )
    description = (
        f"tool-using agents{' (held-out variant)' if cfg.held_out else ''}: a worker calls tools between its LLM"
        f" calls (another tool call with p={p_again}, at most {MAX_TOOL_CALLS}), each call re-sending its prompt,"
        f" answer and the tool's result; a reviewer reads the history; log-normal tool durations: {kinds}"
    )
    return assemble(FAMILY, description, cfg, conversations, graph, rng, plan)
