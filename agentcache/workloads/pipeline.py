"""A static pipeline: the same agents in the same order, ROUNDS times over (KVFlow's home ground).

researcher -> analyst -> writer -> editor, then again, each seeing the whole
history. The order never changes, so the meta line's call graph is exact.
`loop_prob` is not read: nothing here is random but sizes and timing. With the
`hints` knob: the order and the number of calls as the plan, and each next agent
once the answer before it is out.
"""

from __future__ import annotations

import random

from agentcache.trace import Plan, Trace
from agentcache.workloads.common import GenConfig, assemble, make_agents, start_conversations

FAMILY = "pipeline"
ORDER = ["researcher", "analyst", "writer", "editor"]
ROUNDS = 2


def generate(cfg: GenConfig) -> Trace:
    rng = random.Random(cfg.seed)
    agents = make_agents(FAMILY, ORDER, cfg, rng)
    conversations = start_conversations(FAMILY, cfg, rng)
    calls = [name for _ in range(ROUNDS) for name in ORDER]
    for conv in conversations:
        for i, name in enumerate(calls):
            conv.call(agents[name], tool=name == "researcher")
            if i + 1 < len(calls):
                conv.decided(calls[i + 1])  # a fixed order: known once the answer before is out
        conv.end()
    graph = {a: [ORDER[(i + 1) % len(ORDER)]] for i, a in enumerate(ORDER)}
    description = f"static pipeline {' -> '.join(ORDER)}, {ROUNDS} rounds"
    plan = Plan(order=tuple(ORDER), max_turns=len(calls))
    return assemble(FAMILY, description, cfg, conversations, graph, rng, plan)
