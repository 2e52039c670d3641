"""Fact verification with sub-query loops (HoVer-style multi-hop retrieval).

A decomposer splits the claim into 1-3 sub-queries; for each, a retriever
searches (its passages join the history) and, with probability `loop_prob`
(default 0.5), spawns a further retrieval hop, up to MAX_HOPS. A verifier then
judges the evidence and, with probability VERIFY_RETRY, sends the workflow back
for one more round of retrieval before the final verdict.
"""

from __future__ import annotations

import random

from agentcache.trace import Trace
from agentcache.workloads.common import Agent, Conversation, GenConfig, assemble, make_agents, start_conversations

FAMILY = "fact-verify"
DEFAULT_LOOP_PROB = 0.5
MAX_HOPS = 4
VERIFY_RETRY = 0.3


def _retrieve_chain(conv: Conversation, retriever: Agent, p_hop: float) -> None:
    """One sub-query: a retrieval, then further hops while the retriever asks for more."""
    for hop in range(1, MAX_HOPS + 1):
        conv.call(retriever, tool=True)
        if hop == MAX_HOPS or conv.rng.random() >= p_hop:
            break


def generate(cfg: GenConfig) -> Trace:
    rng = random.Random(cfg.seed)
    p_hop = DEFAULT_LOOP_PROB if cfg.loop_prob is None else cfg.loop_prob
    agents = make_agents(FAMILY, ["decomposer", "retriever", "verifier"], cfg, rng)
    conversations = start_conversations(FAMILY, cfg, rng)
    for conv in conversations:
        conv.call(agents["decomposer"])
        for _ in range(conv.rng.randint(1, 3)):
            _retrieve_chain(conv, agents["retriever"], p_hop)
        conv.call(agents["verifier"])
        if conv.rng.random() < VERIFY_RETRY:
            _retrieve_chain(conv, agents["retriever"], p_hop)
            conv.call(agents["verifier"])
        conv.end()
    graph = {"decomposer": ["retriever"], "retriever": ["retriever", "verifier"], "verifier": ["retriever"]}
    description = f"fact verification: decomposer, retriever hops (p={p_hop}, at most {MAX_HOPS}), verifier (retry p={VERIFY_RETRY})"
    return assemble(FAMILY, description, cfg, conversations, graph, rng)
