"""Fact verification with sub-query loops (HoVer-style multi-hop retrieval).

A decomposer splits the claim into 1-3 sub-queries; for each, a retriever
searches (its passages join the history) and, with probability `loop_prob`
(default 0.5), spawns a further retrieval hop, up to MAX_HOPS. A verifier then
judges the evidence and, with probability VERIFY_RETRY, sends the workflow back
for one more round of retrieval before the final verdict. With the `hints` knob:
the graph and the most calls as the plan; the retriever as the next caller
while sub-queries remain (the decomposer's answer says how many), and after a
sub-query's last hop, once its passages are back, whoever follows.
"""

from __future__ import annotations

import random

from agentcache.trace import Plan, Trace
from agentcache.workloads.common import Agent, Conversation, GenConfig, assemble, make_agents, start_conversations

FAMILY = "fact-verify"
DEFAULT_LOOP_PROB = 0.5
MAX_HOPS = 4
VERIFY_RETRY = 0.3


def _retrieve_chain(conv: Conversation, retriever: Agent, p_hop: float, then: str) -> None:
    """One sub-query: a retrieval, then further hops while the retrieved passages call for more. `then`: who
    calls after the chain (the retriever again, for the next sub-query, or the verifier)."""
    for hop in range(1, MAX_HOPS + 1):
        conv.call(retriever, tool=True)
        if then == retriever.name:  # more sub-queries follow: the retriever calls next, hop or not
            conv.decided(retriever.name)
        last = hop == MAX_HOPS or conv.rng.random() >= p_hop
        if then != retriever.name:  # known once the passages are back
            conv.decided(then if last else retriever.name, now=True)
        if last:
            break


def generate(cfg: GenConfig) -> Trace:
    rng = random.Random(cfg.seed)
    p_hop = DEFAULT_LOOP_PROB if cfg.loop_prob is None else cfg.loop_prob
    agents = make_agents(FAMILY, ["decomposer", "retriever", "verifier"], cfg, rng)
    conversations = start_conversations(FAMILY, cfg, rng)
    for conv in conversations:
        conv.call(agents["decomposer"])
        conv.decided("retriever")  # the decomposer's answer holds the sub-queries: how many is known from here
        queries = conv.rng.randint(1, 3)
        for query in range(1, queries + 1):
            _retrieve_chain(conv, agents["retriever"], p_hop, "retriever" if query < queries else "verifier")
        conv.call(agents["verifier"])
        if conv.rng.random() < VERIFY_RETRY:
            conv.decided("retriever")  # the verifier's answer asks for another round
            _retrieve_chain(conv, agents["retriever"], p_hop, "verifier")
            conv.call(agents["verifier"])
        conv.end()
    graph = {"decomposer": ["retriever"], "retriever": ["retriever", "verifier"], "verifier": ["retriever"]}
    description = f"fact verification: decomposer, retriever hops (p={p_hop}, at most {MAX_HOPS}), verifier (retry p={VERIFY_RETRY})"
    plan = Plan(graph={a: tuple(b) for a, b in graph.items()}, max_turns=1 + 3 * MAX_HOPS + 1 + MAX_HOPS + 1)
    return assemble(FAMILY, description, cfg, conversations, graph, rng, plan)
