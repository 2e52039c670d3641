"""Plain multi-turn chat: the traffic agent workflows share a server with.

Conversations arrive as a Poisson process (`rate`; `workflows` counts
conversations) and talk to one of a few assistants, whose system prompts differ
in size and are shared by every conversation with that assistant. Each request
is a workflow of its own, ended as soon as its answer is out: a chat server
sees independent requests, not a workflow. Turn k re-sends the conversation so
far, system prompt + u1, a1, ..., u_k, the earlier answers as the model wrote
them (their output ids), so it extends turn k-1's prompt + output; with
probability `rebuild` (default 0) a turn re-renders the conversation instead.
Users think between turns (exponential, mean THINK_S); after each answer the
user goes on with probability `loop_prob` (default 0.8) and abandons the
conversation otherwise, at most MAX_TURNS turns. `unended` drops the end events
of a share of conversations.
"""

from __future__ import annotations

import random

from agentcache.trace import Segment, Trace
from agentcache.workloads.common import Agent, Conversation, GenConfig, assemble, jitter

FAMILY = "chat"
DEFAULT_LOOP_PROB = 0.8
MAX_TURNS = 16
THINK_S = 30.0
# assistant -> (system prompt size relative to `fixed_tokens`, share of conversations)
ASSISTANTS = {
    "assistant-general": (0.2, 0.4),
    "assistant-writing": (0.5, 0.3),
    "assistant-coding": (1.0, 0.2),
    "assistant-support": (2.0, 0.1),
}
FIRST_MESSAGE_FACTOR = 1.0  # the opening message relative to `task_tokens`; follow-ups are shorter
FOLLOW_UP_FACTOR = 0.3
ANSWER_FACTOR = 2.0  # answers relative to `output_tokens`: chat answers run longer than agent steps


def generate(cfg: GenConfig) -> Trace:
    rng = random.Random(cfg.seed)
    p_more = DEFAULT_LOOP_PROB if cfg.loop_prob is None else cfg.loop_prob
    rebuild = 0.0 if cfg.rebuild is None else cfg.rebuild
    assistants = [
        Agent(name, (Segment(f"sys/{FAMILY}/{name}", jitter(rng, cfg.fixed_tokens * size, 0.2)),))
        for name, (size, _) in ASSISTANTS.items()
    ]
    popularity = [share for _, share in ASSISTANTS.values()]
    conversations = []
    t = 0.0
    for i in range(cfg.workflows):
        assistant = rng.choices(assistants, weights=popularity)[0]
        conv = Conversation(f"{FAMILY}-{i}-1", t, cfg, random.Random(rng.random()), rebuild)
        for turn in range(1, MAX_TURNS + 1):
            conv.workflow = f"{FAMILY}-{i}-{turn}"
            factor = FIRST_MESSAGE_FACTOR if turn == 1 else FOLLOW_UP_FACTOR
            conv.history.append(Segment(f"user/{FAMILY}-{i}/{turn}", jitter(conv.rng, cfg.task_tokens * factor, 0.6)))
            conv.call(assistant, output=jitter(conv.rng, cfg.output_tokens * ANSWER_FACTOR, 0.6))
            conv.end()
            if conv.rng.random() >= p_more:
                break
            conv.ts += conv.rng.expovariate(1.0 / THINK_S)
        conversations.append(conv)
        t += rng.expovariate(cfg.rate)
    # Every request is a workflow of its own: nothing follows an assistant.
    graph: dict[str, list[str]] = {a.name: [] for a in assistants}
    description = (
        f"plain chat with {len(ASSISTANTS)} assistants, a workflow per request; another turn p={p_more}"
        f" (at most {MAX_TURNS}), think time {THINK_S:g} s; turns rebuilt with p={rebuild}"
    )
    return assemble(FAMILY, description, cfg, conversations, graph, rng)
