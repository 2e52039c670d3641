"""An app's plan as a forecaster: a random walk on what its framework declared before any workflow ran.

The plan (agentcache.trace.Plan) may hold a graph (agent -> the agents that may call next; none: the workflow
ends there), a fixed speaking order (repeated, as a round-robin chat repeats it; a sequential task list is an
order with `max_turns` its length), a chain of phases (an agent of a phase may be followed by any agent of its
phase or of the next; the last phase's may end the workflow) and a turn limit. Every edge they declare is
taken as equally likely (a plan states what may happen, never how often); the turn limit makes every row past
the workflow's last allowed call END. An agent the plan does not name has no forecast here (`next_step` None):
whoever blends this with a learned forecaster trusts the learned one alone there.
"""

from __future__ import annotations

from collections.abc import Sequence

from agentcache.predictor.base import DEFAULT_HORIZON, END, Forecast, Predictor
from agentcache.trace.model import Plan


class PlanPredictor(Predictor):
    name = "plan"
    learns_online = False

    def __init__(self, plan: Plan, horizon: int = DEFAULT_HORIZON, source: str = "the app's plan"):
        super().__init__(horizon)
        self.source = source
        self.max_turns = plan.max_turns
        successors: dict[str, set[str]] = {}
        called: set[str] = set()
        for agent, after in (plan.graph or {}).items():
            successors.setdefault(agent, set()).update(after or (END,))
            called.update(after)
        order = plan.order or ()
        for i, agent in enumerate(order):
            following = order[(i + 1) % len(order)]
            successors.setdefault(agent, set()).add(following)
        phases = plan.chain or ()
        for i, (_, agents) in enumerate(phases):
            after = set(agents) | (set(phases[i + 1][1]) if i + 1 < len(phases) else {END})
            for agent in agents:
                successors.setdefault(agent, set()).update(after)
        self.successors = {agent: sorted(after) for agent, after in successors.items()}
        self.known = frozenset(plan.agents)
        if order:
            self.roots = [order[0]]
        elif phases:
            self.roots = sorted(phases[0][1])
        else:
            self.roots = sorted(a for a in self.successors if a not in called) or sorted(self.known)

    def knows(self, agent: str) -> bool:
        return agent in self.known

    def known_agents(self) -> frozenset[str]:
        return self.known

    def next_step(self, agent: str | None) -> dict[str, float] | None:
        """P(next | current agent) as the plan declares it; None where the plan does not name the agent (or,
        for a workflow not started, names no first agent)."""
        if agent is None:
            return {a: 1.0 / len(self.roots) for a in self.roots} if self.roots else None
        after = self.successors.get(agent)
        if after is None:
            return {END: 1.0} if agent in self.known else None
        return {b: 1.0 / len(after) for b in after}

    def calls_left(self, path: Sequence[str]) -> int | None:
        """How many more calls the turn limit allows a workflow at `path` (None: no limit, or the workflow went
        past it already, so it does not bound this app's calls as the plan said)."""
        if self.max_turns is None or len(path) > self.max_turns:
            return None
        return self.max_turns - len(path)

    def predict(self, path: Sequence[str], hidden: Sequence[float] | None = None) -> Forecast:
        """The plan's rows from `path` (an agent it does not name: every row END-free and empty but for what the
        turn limit says), with END absorbing."""
        states: dict[str, float] = {}
        first = self.next_step(path[-1] if path else None)
        ended = 0.0
        rows: Forecast = []
        for k in range(self.horizon):
            step: dict[str, float] = {}
            if k == 0:
                step = dict(first or {})
            else:
                for agent, p in states.items():
                    for b, q in (self.next_step(agent) or {END: 1.0}).items():
                        step[b] = step.get(b, 0.0) + p * q
            ended += step.pop(END, 0.0)
            states = step
            rows.append({**states, END: ended})
        return cap(rows, self.calls_left(path))


def cap(rows: Forecast, calls_left: int | None) -> Forecast:
    """`rows` with every row past the workflow's last allowed call END (None: no limit known)."""
    if calls_left is None or calls_left >= len(rows):
        return rows
    return [*rows[:calls_left], *({END: 1.0} for _ in rows[calls_left:])]
