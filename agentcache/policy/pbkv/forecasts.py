"""What pbkv's forecaster says each workflow reads: v_w(a) = sum_k gamma^(k-1) P_w^(k)(a), and the calls of
workflows not yet started."""

from __future__ import annotations

from agentcache.policy.pbkv.prior import Prior
from agentcache.policy.workflows import WorkflowState
from agentcache.predictor import END, Predictor
from agentcache.predictor.base import PerForecast
from agentcache.predictor.guard import GuardedPredictor
from agentcache.tags import WorkflowKey

MAX_READ_FORECASTS = 1024  # forecasts whose values are kept for the next workflow at the same point


def next_of(rows: list[dict[str, float]]) -> dict[str, float]:
    """P^(1)(a) of a forecast's rows: its next step's agents (END left out)."""
    return {a: p for a, p in rows[0].items() if a != END and p > 0.0}


class Forecasts:
    def __init__(self, predictor: Predictor, gamma: float, budget_ms: float | None) -> None:
        self.predictor = GuardedPredictor(predictor, budget_ms=budget_ms)
        self.gamma = gamma
        # workflow -> v_w(a), refreshed on its transitions; workflows at the same point share one (read-only)
        self.values: dict[WorkflowKey, dict[str, float]] = {}
        self.next: dict[WorkflowKey, dict[str, float]] = {}  # workflow -> P_w^(1)(a), for prefetching (shared)
        # workflow -> its forecast's values, while `values` holds those of its pause (paused) or of what its
        # framework told (told)
        self._unpaused: dict[WorkflowKey, dict[str, float]] = {}
        self._untold: dict[WorkflowKey, dict[str, float]] = {}
        # each forecast's v(a) and P^(1)(a), read once for every workflow at the same point
        self._read: PerForecast[tuple[dict[str, float], dict[str, float]]] = PerForecast(MAX_READ_FORECASTS)

    def moved(self, state: WorkflowState, prior: Prior | None = None) -> None:
        """A workflow moved to the last agent of its path: learn the step, forecast what follows (blended with
        its app's plan where it has one, `prior`)."""
        path = state.path
        self.predictor.observe(path[:-1], path[-1])
        rows = self.predictor.predict(path)
        if prior is not None:
            prior.moved(path)
        blended = prior.blend(path, rows) if prior is not None else rows
        read = self._read.get(rows) if blended is rows else None
        if read is None:
            read = (self.discounted(blended), next_of(blended))
            if blended is rows:  # workflows at the same point get the same rows (until the predictor refreshes)
                self._read.put(rows, read)
        self.values[state.id], self.next[state.id] = read
        if self._unpaused:
            self._unpaused.pop(state.id, None)
        if self._untold:
            self._untold.pop(state.id, None)

    def told(self, state: WorkflowState, agents: tuple[str, ...], prior: Prior | None = None) -> None:
        """The app's framework decided that one of `agents` makes the workflow's next call: that step is theirs,
        equally, and the steps after it are what the forecast says from each, until the call arrives (moved). A
        pause of the workflow says more (its agent calls next, when its tool returns): it reads the forecast's
        own values (paused)."""
        share = 1.0 / len(agents)
        rows: list[dict[str, float]] = [dict.fromkeys(agents, share)]
        for agent in agents:
            after = (*state.path, agent)
            then = self.predictor.predict(after)
            if prior is not None:
                then = prior.blend(after, then)
            for k, row in enumerate(then[: len(then) - 1], start=1):
                if k == len(rows):
                    rows.append({})
                into = rows[k]
                for a, p in row.items():
                    into[a] = into.get(a, 0.0) + share * p
        own = self._unpaused.pop(state.id, None) or self._untold.get(state.id) or self.values.get(state.id)
        if own is not None:
            self._untold[state.id] = own
        self.values[state.id], self.next[state.id] = self.discounted(rows), next_of(rows)

    def paused(self, workflow: WorkflowKey, waiting: list[str]) -> None:
        """The workflow's next caller is one of `waiting` (agents waiting on a tool, or back from one): each is
        worth at least the one call it makes for certain, v(a) = max(v_w(a), 1); the forecast's own values
        already count its return where the forecaster has learned it (raising them more valued paused paths
        above what they are read, measured). With none waiting, the forecast's own values again."""
        own = self._unpaused.pop(workflow, None) or self._untold.pop(workflow, None)
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
        self._untold.pop(state.id, None)

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
