"""Shared machinery of the workload generators: knobs, agents, conversations, arrivals.

Prompts are built the way agent frameworks build them: the agent's fixed
prompt first (system prompt, tools, examples), then the workflow's shared
context (the task), then its history (earlier agents' outputs, tool results).
A call either extends the history as it grew, so each request's output comes
back as a segment of later prompts through its ``output_id``, or rebuilds its
prompt: the shared context, then the history re-rendered as a fresh segment no
other prompt holds, as apps that template prompts from their state do.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, fields
from typing import Any

from agentcache.trace import AgentDone, End, Event, Meta, Next, Plan, Request, Segment, Trace


@dataclass
class GenConfig:
    """Knobs shared by every family; a family documents which ones it reads and its defaults."""

    workflows: int = 200
    rate: float = 0.5  # new workflows per second (Poisson arrivals); concurrency ~ rate x workflow duration
    fixed_tokens: int = 1500  # mean size of an agent's fixed prompt
    task_tokens: int = 300  # size of a workflow's task statement
    output_tokens: int = 150  # mean tokens generated per request
    tool_tokens: int = 300  # mean size of a tool result (test log, retrieved passage)
    loop_prob: float | None = None  # family-specific loop/branch probability (None: the family's default)
    rebuild: float | None = None  # probability that a call rebuilds its prompt (None: the family's default)
    unended: float = 0.0  # share of workflows whose end event never comes
    seed: int = 0
    decode_tok_s: float = 50.0  # generation speed used to space a workflow's requests
    tool_s: float = 2.0  # mean tool execution time between calls
    held_out: bool = False  # the family's held-out variant (other agents, tools, durations), where it has one
    # What the family's framework would tell the server, where and when it would know it: the meta line's plan,
    # `next` events (a router's decision once the answer it routes on is out, a fixed order, a task list) and
    # `agent_done` events (a phase over). Off: the trace is byte for byte what it was before they existed.
    hints: bool = False

    def __post_init__(self) -> None:
        if self.workflows < 1:
            raise ValueError(f"workflows must be >= 1, got {self.workflows}")
        if self.rate <= 0:
            raise ValueError(f"rate must be > 0, got {self.rate}")
        for name in ("fixed_tokens", "task_tokens", "output_tokens", "tool_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.loop_prob is not None and not 0.0 <= self.loop_prob < 1.0:
            raise ValueError(f"loop_prob must be in [0, 1), got {self.loop_prob}")
        if self.rebuild is not None and not 0.0 <= self.rebuild <= 1.0:
            raise ValueError(f"rebuild must be in [0, 1], got {self.rebuild}")
        if not 0.0 <= self.unended <= 1.0:
            raise ValueError(f"unended must be in [0, 1], got {self.unended}")

    def knobs(self) -> dict[str, Any]:
        """The knobs as set; `rebuild`, `held_out` and `hints` only when set, so traces written before they existed
        stay byte-identical."""
        unset = {"rebuild": None, "held_out": False, "hints": False}
        return {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if f.name not in unset or getattr(self, f.name) != unset[f.name]
        }


def jitter(rng: random.Random, mean: float, spread: float = 0.3) -> int:
    """A positive integer around `mean` (uniform +-spread)."""
    return max(1, round(mean * rng.uniform(1.0 - spread, 1.0 + spread)))


@dataclass
class Agent:
    name: str
    fixed: tuple[Segment, ...]  # system prompt, tools, examples: identical on every call


def make_agents(
    family: str, names: list[str], cfg: GenConfig, rng: random.Random, mean_tokens: float | None = None
) -> dict[str, Agent]:
    """Agents with fixed prompts of different sizes (mean `mean_tokens`, default the `fixed_tokens` knob):
    a system prompt plus a tool/example block."""
    agents = {}
    for name in names:
        size = jitter(rng, cfg.fixed_tokens if mean_tokens is None else mean_tokens, 0.5)
        system = max(1, size * 2 // 5)
        agents[name] = Agent(
            name,
            (Segment(f"sys/{family}/{name}", system), Segment(f"tools/{family}/{name}", max(1, size - system))),
        )
    return agents


RENDER_FRAME_TOKENS = 40  # mean framing of a re-rendered history: headings, speaker labels, the turn's cue


@dataclass
class Conversation:
    """One workflow (in plain chat, one conversation of one-request workflows): its shared context, its
    history and the requests it has sent.

    A call rebuilds its prompt with probability `rebuild`; otherwise it extends the history.
    """

    workflow: str
    ts: float
    cfg: GenConfig
    rng: random.Random
    rebuild: float = 0.0
    context: list[Segment] = field(default_factory=list)  # the task; a phased chat's phase adds its own
    history: list[Segment] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    calls: int = 0
    answered: float = 0.0  # when the last call's answer was out: what the framework decides on is known from then
    # A stream of its own, so that rebuilding changes how prompts look, never which agents run or what they say.
    render_rng: random.Random = field(init=False)

    def __post_init__(self) -> None:
        self.render_rng = random.Random(f"{self.cfg.seed}/{self.workflow}")

    def call(
        self,
        agent: Agent,
        *,
        view: list[Segment] | None = None,
        tool: bool = False,
        output: int | None = None,
        remember: bool = True,
    ) -> Request:
        """Send one request of `agent`: its fixed prompt + the shared context + `view` (default: the whole history).

        A rebuilding call shows `view` as one fresh segment of the same size plus framing. The output
        joins the history (unless `remember` is False); a tool call's result follows it. The clock
        moves on by generation and tool time.
        """
        self.calls += 1
        out_tokens = output if output is not None else jitter(self.rng, self.cfg.output_tokens, 0.5)
        out_id = f"out/{self.workflow}/{self.calls}"
        shown = self.history if view is None else view
        if self.rebuild and self.render_rng.random() < self.rebuild:
            rendered = sum(s.tokens for s in shown) + jitter(self.render_rng, RENDER_FRAME_TOKENS)
            shown = [Segment(f"render/{self.workflow}/{self.calls}", rendered)]
        request = Request(
            ts=round(self.ts, 3),
            workflow=self.workflow,
            agent=agent.name,
            segments=agent.fixed + tuple(self.context) + tuple(shown),
            fixed=len(agent.fixed),
            output=out_tokens,
            output_id=out_id,
        )
        self.events.append(request)
        if remember:
            self.history.append(Segment(out_id, out_tokens))
        self.ts += 0.3 + out_tokens / self.cfg.decode_tok_s
        self.answered = self.ts
        if tool:
            self.history.append(
                Segment(f"tool/{self.workflow}/{self.calls}", jitter(self.rng, self.cfg.tool_tokens, 0.6))
            )
            self.ts += self.rng.expovariate(1.0 / self.cfg.tool_s)
        else:
            self.ts += self.rng.uniform(0.05, 0.3)  # framework overhead between calls
        return request

    def end(self) -> None:
        self.events.append(End(round(self.ts, 3), self.workflow))

    def decided(self, *agents: str, now: bool = False) -> None:
        """With the `hints` knob: the framework decided that one of `agents` makes the next call, on the last
        call's answer (at its end), or on what came since, a tool's result (`now`: when it came)."""
        if self.cfg.hints:
            self.events.append(Next(round(self.ts if now else self.answered, 3), self.workflow, agents))

    def finished(self, *agents: str) -> None:
        """With the `hints` knob: the last call's answer ended a phase, whose agents' contexts are done."""
        if self.cfg.hints:
            at = round(self.answered, 3)
            self.events.extend(AgentDone(at, self.workflow, agent) for agent in agents)


def start_conversations(
    family: str, cfg: GenConfig, rng: random.Random, *, default_rebuild: float = 0.0
) -> list[Conversation]:
    """Poisson arrivals; each workflow starts with its task statement as shared context.

    Calls rebuild their prompts with probability `cfg.rebuild`, or the family's `default_rebuild` when unset.
    """
    rebuild = default_rebuild if cfg.rebuild is None else cfg.rebuild
    conversations = []
    t = 0.0
    for i in range(cfg.workflows):
        wid = f"{family}-{i}"
        conv = Conversation(wid, t, cfg, random.Random(rng.random()), rebuild)
        conv.context.append(Segment(f"task/{wid}", jitter(rng, cfg.task_tokens, 0.5)))
        conversations.append(conv)
        t += rng.expovariate(cfg.rate)
    return conversations


def assemble(
    family: str,
    description: str,
    cfg: GenConfig,
    conversations: list[Conversation],
    call_graph: dict[str, list[str]],
    rng: random.Random,
    plan: Plan | None = None,
) -> Trace:
    """Merge the workflows' events in time order; drop the end events of the `unended` share. `plan`: what the
    family's framework knows before it runs, in the meta line with the `hints` knob."""
    unended = set(rng.sample(range(len(conversations)), round(cfg.unended * len(conversations))))
    tagged: list[tuple[float, int, int, Event]] = []
    for i, conv in enumerate(conversations):
        for j, event in enumerate(conv.events):
            if isinstance(event, End) and i in unended:
                continue
            tagged.append((event.ts, i, j, event))
    tagged.sort(key=lambda x: (x[0], x[1], x[2]))
    meta = Meta(
        name=family,
        description=description,
        call_graph={a: sorted(set(s)) for a, s in sorted(call_graph.items())},
        extra={"generator": {"family": family, **cfg.knobs()}},
        plan=plan if cfg.hints else None,
    )
    return Trace(meta, [e for *_, e in tagged])
