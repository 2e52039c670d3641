"""An app's plan as the prior of its workflows' forecasts (issue 53).

The plan's rows (agentcache.predictor.plan) are blended with the learned ones, the plan weighing as one step out
of the workflow's current agent against the steps out of it the app's workflows took since (1 / (1 + n):
learning takes over as they teach it), and its turn limit makes every row past a workflow's last allowed call
END, until a workflow of the app makes more calls than the limit: a framework's turn (an AutoGen speaker turn, a
LangGraph superstep) may hold several LLM calls (a selector's, a tool loop's), so that limit bounds turns, not
calls, and caps nothing from then on.
"""

from __future__ import annotations

from collections.abc import Sequence

from agentcache.predictor.base import AgentCoverage, Forecast
from agentcache.predictor.plan import PlanPredictor, cap
from agentcache.trace.model import Plan


class Prior:
    """One app's plan, as the prior of its workflows' forecasts."""

    def __init__(self, plan: Plan, horizon: int, coverage: AgentCoverage, seen: dict[str, int] | None = None):
        self.plan = PlanPredictor(plan, horizon)
        self.coverage = coverage
        # agent the plan names -> the steps out of it the app's workflows took: what the forecaster learned of it
        self.seen: dict[str, int] = seen if seen is not None else {}
        self.caps_calls = plan.max_turns is not None  # False once a workflow made more calls than the turn limit

    def moved(self, path: Sequence[str]) -> None:
        """A workflow of the app took a step (to the last agent of `path`)."""
        if len(path) > 1 and self.plan.knows(path[-2]):
            self.seen[path[-2]] = self.seen.get(path[-2], 0) + 1

    def blend(self, path: Sequence[str], rows: Forecast) -> Forecast:
        """The learned `rows` of a workflow at `path` with the plan's mixed in (where the plan names its agent)
        and cut at its turn limit; `rows` itself where the plan changes nothing."""
        plan = self.plan
        agent = path[-1] if path else None
        self.coverage.count(plan, agent)
        left = plan.calls_left(path) if self.caps_calls else None
        if left is None and self.caps_calls:
            self.caps_calls = False  # this workflow went past the turn limit: it does not count LLM calls
        named = agent is None or plan.knows(agent)
        if not named and (left is None or left >= len(rows)):
            return rows
        if named:
            weight = 1.0 / (1.0 + self.seen.get(agent, 0)) if agent is not None else 1.0
            planned = plan.predict(path)
            rows = [mixed(row, prior, weight) for row, prior in zip(rows, planned)]
        return cap(rows, left)


def mixed(learned: dict[str, float], planned: dict[str, float], weight: float) -> dict[str, float]:
    """(1 - weight) learned + weight planned."""
    out = {a: (1.0 - weight) * p for a, p in learned.items()}
    for a, p in planned.items():
        out[a] = out.get(a, 0.0) + weight * p
    return out
