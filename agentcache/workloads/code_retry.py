"""Code assistant with a test-and-retry loop (PBKV's Figure 1).

planner -> coder -> tester; when the tests fail (probability `loop_prob`,
default 0.6) the tester routes back through the analyzer to the coder. After
MAX_ROUNDS attempts the loop stops whatever the tests say, so the exit depends
on the workflow's history, not only on its current agent. The tester runs the
tests: their log joins the history. With the `hints` knob: the graph and the
most calls a workflow makes as the plan, and each next agent once the answer
(or the tests' result) it follows is out.
"""

from __future__ import annotations

import random

from agentcache.trace import Plan, Trace
from agentcache.workloads.common import GenConfig, assemble, make_agents, start_conversations

FAMILY = "code-retry"
DEFAULT_LOOP_PROB = 0.6
MAX_ROUNDS = 3


def generate(cfg: GenConfig) -> Trace:
    rng = random.Random(cfg.seed)
    p_fail = DEFAULT_LOOP_PROB if cfg.loop_prob is None else cfg.loop_prob
    agents = make_agents(FAMILY, ["planner", "coder", "tester", "analyzer"], cfg, rng)
    conversations = start_conversations(FAMILY, cfg, rng)
    for conv in conversations:
        conv.call(agents["planner"])
        conv.decided("coder")  # fixed edges: known once the answer before them is out
        for attempt in range(1, MAX_ROUNDS + 1):
            conv.call(agents["coder"])
            conv.decided("tester")
            conv.call(agents["tester"], tool=True)
            if attempt == MAX_ROUNDS or conv.rng.random() >= p_fail:
                break
            conv.decided("analyzer", now=True)  # the router reads the tests' result: known when they return
            conv.call(agents["analyzer"])
            conv.decided("coder")
        conv.end()
    graph = {"planner": ["coder"], "coder": ["tester"], "tester": ["analyzer"], "analyzer": ["coder"]}
    description = f"code assistant: planner, coder, tester; failing tests (p={p_fail}) retry via analyzer, at most {MAX_ROUNDS} attempts"
    # The graph's edges (the tester's conditional edge declares the analyzer; its other target is the end) and the
    # recursion limit: the most calls a workflow makes.
    plan = Plan(graph={a: tuple(b) for a, b in graph.items()}, max_turns=1 + 2 * MAX_ROUNDS + (MAX_ROUNDS - 1))
    return assemble(FAMILY, description, cfg, conversations, graph, rng, plan)
