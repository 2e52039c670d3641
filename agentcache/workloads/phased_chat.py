"""Software company of role agents in phased chat chains (ChatDev-like).

A run builds one program for one task through phases: demand analysis, language
choice, coding, code review (a reviewer comments; while it finds issues, with
probability `loop_prob` (default 0.5), the programmer modifies the code and
the reviewer looks again, at most MAX_REVIEW_ROUNDS times), testing (the code
runs; while bugs remain, probability `loop_prob`, the programmer fixes them
and it runs again, at most MAX_TEST_ROUNDS times) and documentation. Each phase
is a chat of a few alternating turns between two roles; its assistant's last
turn is the phase's result.

Prompts are rebuilt (`rebuild` defaults to 1.0), as in recorded apps of this
kind: the role's fixed prompt (the same in every phase), the run's task, the
phase's instructions (a per-run segment that embeds the task), the earlier
phases' results it reads (the code as the programmer wrote it, the test report)
and a fresh tail, this phase's chat re-rendered. Reuse thus comes from shared
prefixes, about a third of it from fixed prompts and two thirds from the run's
shared context, as in the recording.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from agentcache.trace import Plan, Segment, Trace
from agentcache.workloads.common import (
    Agent,
    Conversation,
    GenConfig,
    assemble,
    jitter,
    make_agents,
    start_conversations,
)

FAMILY = "phased-chat"
DEFAULT_LOOP_PROB = 0.5
DEFAULT_REBUILD = 1.0
MAX_REVIEW_ROUNDS = 3
MAX_TEST_ROUNDS = 3
MAX_EXCHANGES = 3  # a phase's chat: 1-3 assistant turns, with the instructor's replies between them
# Role prompts are short next to the instructions and code that follow them: sizes that put a third of the
# reusable tokens in fixed prompts, as in the recording.
ROLE_PROMPT_FACTOR = 0.5  # a role's fixed prompt relative to the `fixed_tokens` knob
PHASE_TEMPLATE_TOKENS = 1000  # mean size of a phase's instructions besides the task they embed
CODE_OUTPUT_FACTOR = 8  # a code-writing turn's output relative to an ordinary turn's


@dataclass(frozen=True)
class Phase:
    assistant: str  # answers the phase's instructions; its last turn is the phase's result
    instructor: str  # gives the instructions and replies
    reads: tuple[str, ...]  # earlier results in the phase's context, in this order
    result: str  # the name later phases read its result by


PHASES = {
    "demand-analysis": Phase("cpo", "ceo", (), "modality"),
    "language-choice": Phase("cto", "ceo", ("modality",), "language"),
    "coding": Phase("programmer", "cto", ("modality", "language"), "code"),
    "review-comment": Phase("reviewer", "programmer", ("modality", "language", "code"), "comments"),
    "review-modification": Phase("programmer", "reviewer", ("modality", "language", "code", "comments"), "code"),
    "test": Phase("tester", "programmer", ("language", "code", "test-report"), "bugs"),
    "test-modification": Phase("programmer", "tester", ("language", "code", "test-report", "bugs"), "code"),
    "documentation": Phase("cpo", "programmer", ("modality", "language", "code"), "manual"),
}
NEXT_PHASES = {
    "demand-analysis": ["language-choice"],
    "language-choice": ["coding"],
    "coding": ["review-comment"],
    "review-comment": ["review-modification", "test"],
    "review-modification": ["review-comment", "test"],
    "test": ["test-modification", "documentation"],
    "test-modification": ["test"],
    "documentation": [],
}
ROLES = ["ceo", "cpo", "cto", "programmer", "reviewer", "tester"]


class _Run:
    """One run's chat chain: its conversation, its task and the phases' results so far."""

    def __init__(self, conv: Conversation, agents: dict[str, Agent], templates: dict[str, int]):
        self.conv, self.agents, self.templates = conv, agents, templates
        self.task = conv.context[0]
        self.results: dict[str, Segment] = {}
        self.last = ""  # the phase that ran last, and its roles that spoke
        self.spoke: set[str] = set()

    def phase(self, name: str) -> None:
        """Chat through phase `name`: a fresh context and history, alternating turns, the assistant's last. With
        the `hints` knob the chat chain tells each next speaker within the phase once the turn before is out."""
        conv, phase = self.conv, PHASES[name]
        instructions = Segment(f"phase/{conv.workflow}/{name}", self.task.tokens + self.templates[name])
        conv.context = [self.task, instructions, *(self.results[r] for r in phase.reads)]
        conv.history = []
        exchanges = conv.rng.randint(1, MAX_EXCHANGES) - 1
        for _ in range(exchanges):
            conv.call(self.agents[phase.assistant])
            conv.decided(phase.instructor)
            conv.call(self.agents[phase.instructor])
            conv.decided(phase.assistant)
        writes_code = phase.result == "code"
        output = jitter(conv.rng, conv.cfg.output_tokens * CODE_OUTPUT_FACTOR, 0.5) if writes_code else None
        final = conv.call(self.agents[phase.assistant], output=output)
        self.results[phase.result] = Segment(final.output_id, final.output)
        self.last = name
        self.spoke = {phase.assistant, phase.instructor} if exchanges else {phase.assistant}

    def then(self, name: str) -> None:
        """With the `hints` knob: phase `name` comes next, as the chain decided once the last phase's result was
        out. Its assistant speaks next; where the chain cannot come back to the last phase from `name`, the
        contexts of its roles that spoke are done (each role's next call, if any, starts from another phase's
        instructions)."""
        conv = self.conv
        conv.decided(PHASES[name].assistant)
        if self.last not in phases_from(name):
            conv.finished(*sorted(self.spoke))

    def run_tests(self, attempt: int) -> None:
        """Run the code: the report is a segment the test phases read."""
        conv = self.conv
        self.results["test-report"] = Segment(
            f"test-report/{conv.workflow}/{attempt}", jitter(conv.rng, conv.cfg.tool_tokens, 0.6)
        )
        conv.ts += conv.rng.expovariate(1.0 / conv.cfg.tool_s)


def phases_from(name: str) -> set[str]:
    """Phase `name` and every phase the chain may reach from it."""
    seen, todo = set(), [name]
    while todo:
        phase = todo.pop()
        if phase not in seen:
            seen.add(phase)
            todo.extend(NEXT_PHASES[phase])
    return seen


def role_graph() -> dict[str, list[str]]:
    """Which role may speak after which: turns within a phase, and a phase's last turn before the next's first."""
    graph: dict[str, set[str]] = {role: set() for role in ROLES}
    for name, phase in PHASES.items():
        graph[phase.assistant].add(phase.instructor)
        graph[phase.instructor].add(phase.assistant)
        for after in NEXT_PHASES[name]:
            graph[phase.assistant].add(PHASES[after].assistant)
    return {role: sorted(after) for role, after in graph.items()}


def generate(cfg: GenConfig) -> Trace:
    rng = random.Random(cfg.seed)
    p_issue = DEFAULT_LOOP_PROB if cfg.loop_prob is None else cfg.loop_prob
    rebuild = DEFAULT_REBUILD if cfg.rebuild is None else cfg.rebuild
    agents = make_agents(FAMILY, ROLES, cfg, rng, cfg.fixed_tokens * ROLE_PROMPT_FACTOR)
    templates = {name: jitter(rng, PHASE_TEMPLATE_TOKENS, 0.5) for name in PHASES}
    conversations = start_conversations(FAMILY, cfg, rng, default_rebuild=DEFAULT_REBUILD)
    for conv in conversations:
        run = _Run(conv, agents, templates)
        run.phase("demand-analysis")
        # The chain's phase order is fixed; where it branches, the phase's last answer (issues found or not, bugs
        # left or not) decides, known once it is out.
        run.then("language-choice")
        run.phase("language-choice")
        run.then("coding")
        run.phase("coding")
        run.then("review-comment")
        for review in range(1, MAX_REVIEW_ROUNDS + 1):
            run.phase("review-comment")
            if conv.rng.random() >= p_issue:
                break
            run.then("review-modification")
            run.phase("review-modification")
            if review < MAX_REVIEW_ROUNDS:
                run.then("review-comment")
        run.then("test")
        for attempt in range(1, MAX_TEST_ROUNDS + 1):
            run.run_tests(attempt)
            run.phase("test")
            if attempt == MAX_TEST_ROUNDS or conv.rng.random() >= p_issue:
                break
            run.then("test-modification")
            run.phase("test-modification")
            run.then("test")
        run.then("documentation")
        run.phase("documentation")
        conv.end()
    description = (
        f"phased chat chain of {len(ROLES)} roles: demand analysis, language choice, coding, review (issues p={p_issue},"
        f" at most {MAX_REVIEW_ROUNDS} rounds), test (bugs p={p_issue}, at most {MAX_TEST_ROUNDS} runs),"
        f" documentation; prompts rebuilt with p={rebuild}"
    )
    return assemble(FAMILY, description, cfg, conversations, role_graph(), rng, chain_plan())


def chain_plan() -> Plan:
    """The chat chain as its framework declares it: the phases in order (the loops' phases once each), each with
    its two roles, and the most calls a run makes."""
    order = ["demand-analysis", "language-choice", "coding", "review-comment", "review-modification", "test"]
    order += ["test-modification", "documentation"]
    chain = tuple((name, tuple(dict.fromkeys((PHASES[name].assistant, PHASES[name].instructor)))) for name in order)
    phases = 3 + 2 * MAX_REVIEW_ROUNDS + 2 * MAX_TEST_ROUNDS - 1 + 1
    return Plan(chain=chain, max_turns=phases * (2 * MAX_EXCHANGES - 1))
