"""What pbkv's forecaster says each workflow reads: v_w(a) = sum_k gamma^(k-1) P_w^(k)(a), and the calls of
workflows not yet started."""

from __future__ import annotations

from agentcache.policy.workflows import WorkflowState
from agentcache.predictor import END, Predictor
from agentcache.predictor.base import PerForecast
from agentcache.predictor.guard import GuardedPredictor
from agentcache.tags import WorkflowKey

MAX_READ_FORECASTS = 1024  # forecasts whose values are kept for the next workflow at the same point


class Forecasts:
    def __init__(self, predictor: Predictor, gamma: float, budget_ms: float | None) -> None:
        self.predictor = GuardedPredictor(predictor, budget_ms=budget_ms)
        self.gamma = gamma
        # workflow -> v_w(a), refreshed on its transitions; workflows at the same point share one (read-only)
        self.values: dict[WorkflowKey, dict[str, float]] = {}
        self.next: dict[WorkflowKey, dict[str, float]] = {}  # workflow -> P_w^(1)(a), for prefetching (shared)
        # workflow -> its forecast's values, while `values` holds those of its pause (paused)
        self._unpaused: dict[WorkflowKey, dict[str, float]] = {}
        # each forecast's v(a) and P^(1)(a), read once for every workflow at the same point
        self._read: PerForecast[tuple[dict[str, float], dict[str, float]]] = PerForecast(MAX_READ_FORECASTS)

    def moved(self, state: WorkflowState) -> None:
        """A workflow moved to the last agent of its path: learn the step, forecast what follows."""
        path = state.path
        self.predictor.observe(path[:-1], path[-1])
        rows = self.predictor.predict(path)
        # Workflows at the same point get the same rows (until the predictor refreshes): read them once.
        read = self._read.get(rows)
        if read is None:
            next_agents = {a: p for a, p in rows[0].items() if a != END and p > 0.0}
            read = (self.discounted(rows), next_agents)
            self._read.put(rows, read)
        self.values[state.id], self.next[state.id] = read
        if self._unpaused:
            self._unpaused.pop(state.id, None)

    def paused(self, workflow: WorkflowKey, waiting: list[str]) -> None:
        """The workflow's next caller is one of `waiting` (agents waiting on a tool, or back from one): each is
        worth at least the one call it makes for certain, v(a) = max(v_w(a), 1); the forecast's own values
        already count its return where the forecaster has learned it (raising them more valued paused paths
        above what they are read, measured). With none waiting, the forecast's own values again."""
        own = self._unpaused.pop(workflow, None)
        if own is None:
            own = self.values.get(workflow)
            if own is None:  # not active
                return
        if not waiting:
            self.values[workflow] = own
            return
        values = dict(own)
        for agent in waiting:
            if values.get(agent, 0.0) < 1.0:
                values[agent] = 1.0
        self.values[workflow] = values
        self._unpaused[workflow] = own

    def ended(self, state: WorkflowState) -> None:
        self.predictor.observe(state.path, END)
        self.values.pop(state.id, None)
        self.next.pop(state.id, None)
        self._unpaused.pop(state.id, None)

    def discounted(self, rows: list[dict[str, float]]) -> dict[str, float]:
        """sum_k gamma^(k-1) row_k(a) for every agent a."""
        values: dict[str, float] = {}
        weight = 1.0
        for row in rows:
            for agent, p in row.items():
                if agent != END:
                    values[agent] = values.get(agent, 0.0) + weight * p
            weight *= self.gamma
        return values

    def arrivals(self, per_step: float) -> dict[str, float]:
        """Discounted calls of each agent by workflows that start within the horizon, `per_step` of them
        starting per step (0: none known)."""
        if per_step <= 0.0:
            return {}
        arrivals: dict[str, float] = {}
        cumulative: dict[str, float] = {}
        weight = 1.0
        for row in self.predictor.predict([]):
            for agent, p in row.items():
                if agent != END:
                    cumulative[agent] = cumulative.get(agent, 0.0) + p
            for agent, c in cumulative.items():
                arrivals[agent] = arrivals.get(agent, 0.0) + per_step * weight * c
            weight *= self.gamma
        return arrivals
