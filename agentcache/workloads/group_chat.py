"""Selector group chat (AutoGen's SelectorGroupChat).

Before every turn a selector call picks the next speaker: its prompt has no
system message, only the selector template (role descriptions) followed by the
whole conversation, and its few output tokens never join the history. The
speaker then answers. Speakers follow probabilistic transitions; the critic
ends the chat unless it rejects the work (probability `loop_prob`, default
0.5), and the chat stops after MAX_TURNS turns in any case. With the `hints`
knob: the graph and the turn limit as the plan; the speaker once the selector
has answered, and the selector once a turn that does not end the chat is out.
"""

from __future__ import annotations

import random

from agentcache.trace import Plan, Segment, Trace
from agentcache.workloads.common import Agent, GenConfig, assemble, jitter, make_agents, start_conversations

FAMILY = "group-chat"
DEFAULT_LOOP_PROB = 0.5
MAX_TURNS = 14
SELECTOR_OUTPUT = 4

TRANSITIONS = {
    "planner": {"researcher": 0.4, "coder": 0.5, "critic": 0.1},
    "researcher": {"planner": 0.3, "coder": 0.5, "critic": 0.2},
    "coder": {"executor": 0.7, "critic": 0.3},
    "executor": {"coder": 0.5, "critic": 0.5},
    "critic": {"planner": 0.4, "coder": 0.6},  # only after a rejection
}


def generate(cfg: GenConfig) -> Trace:
    rng = random.Random(cfg.seed)
    p_reject = DEFAULT_LOOP_PROB if cfg.loop_prob is None else cfg.loop_prob
    agents = make_agents(FAMILY, list(TRANSITIONS), cfg, rng)
    selector = Agent("selector", (Segment(f"{FAMILY}/selector-template", jitter(rng, cfg.fixed_tokens * 0.6, 0.2)),))
    conversations = start_conversations(FAMILY, cfg, rng)
    for conv in conversations:
        speaker = "planner"
        for turn in range(MAX_TURNS):
            conv.call(selector, output=SELECTOR_OUTPUT, remember=False)
            conv.decided(speaker)  # the selector's answer names the speaker
            conv.call(agents[speaker], tool=speaker in ("executor", "researcher"))
            if speaker == "critic" and conv.rng.random() >= p_reject:
                break
            if turn < MAX_TURNS - 1:  # the chat goes on: a selector call comes next, known once the turn is out
                conv.decided("selector")
            choices = TRANSITIONS[speaker]
            speaker = conv.rng.choices(list(choices), weights=list(choices.values()))[0]
        conv.end()
    graph = {a: ["selector"] for a in TRANSITIONS}  # a selector call precedes every turn
    graph["selector"] = sorted(TRANSITIONS)
    description = (
        f"selector group chat, {len(TRANSITIONS)} speakers, critic rejects with p={p_reject}, at most {MAX_TURNS} turns"
    )
    # AutoGen's max_turns counts the speakers' turns; a workflow's calls are twice that (a selector call each).
    plan = Plan(graph={a: tuple(b) for a, b in graph.items()}, max_turns=2 * MAX_TURNS)
    return assemble(FAMILY, description, cfg, conversations, graph, rng, plan)
