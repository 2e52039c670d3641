"""pbkv's clock and the timing weight phi_w: how soon a workflow calls again, learned from the gaps between a
workflow's requests and the time between new workflows."""

from __future__ import annotations

from agentcache.policy.gaps import GapModel
from agentcache.policy.pauses import Pauses
from agentcache.policy.workflows import WorkflowState

MAX_GAP_MODELS = 1024  # agents whose gap distribution is kept
PER_AGENT_GAPS = 128  # recent gaps kept per agent
MIN_AGENT_GAPS = 8  # fewer than this: use every workflow's gaps


class Timing:
    def __init__(self, gamma: float, timed: bool, pauses: Pauses | None = None) -> None:
        self.gamma = gamma
        self.timed = timed  # the `timing` ingredient: else every weight is 1
        # The `tools` ingredient: a workflow whose agent waits on a tool is due when the tool returns.
        self.pauses = pauses
        self.now = 0.0  # the policy clock, at the latest request
        self.gaps = GapModel()  # gaps between a workflow's consecutive requests
        self.gaps_after: dict[str, GapModel] = {}  # the same, by the agent of the earlier request
        self.arrival_gap = 0.0  # EWMA of the time between new workflows (1 / lambda)
        self._last_start: float | None = None
        self.weights_computed = 0  # for benchmarks and tests

    def observe(self, known: WorkflowState | None, now: float) -> None:
        """A request of the workflow `known` (None: a new one) arrived at `now`."""
        if known is not None:
            gap = now - known.last_seen
            self.gaps.add(gap)
            if known.agent is not None:
                per_agent = self.gaps_after.get(known.agent)
                if per_agent is None:
                    if len(self.gaps_after) >= MAX_GAP_MODELS:
                        del self.gaps_after[next(iter(self.gaps_after))]
                    per_agent = self.gaps_after[known.agent] = GapModel(window=PER_AGENT_GAPS)
                per_agent.add(gap)
        else:
            if self._last_start is not None:
                self.arrival_gap = _ewma(self.arrival_gap, now - self._last_start)
            self._last_start = now

    def new_per_step(self) -> float:
        """lambda * g: new workflows per step of a workflow (0 until both are known)."""
        step_gap = self.gaps.mean
        if self.arrival_gap <= 0.0 or step_gap <= 0.0:
            return 0.0
        return step_gap / self.arrival_gap

    def weight(self, state: WorkflowState) -> float:
        """gamma^(residual / g): step discounting continued into the time before w's next request."""
        step_gap = self.gaps.mean
        if not self.timed or step_gap <= 0.0:
            return 1.0
        return self._weight(state, self._gaps_after(state), step_gap)

    def refresh_weight(self, state: WorkflowState, chosen: dict[str | None, GapModel], step_gap: float) -> float:
        """weight() for a refresh, which picks each agent's gaps once (in `chosen`) for all its workflows."""
        path = state.path
        agent = path[-1] if path else None
        gaps = chosen.get(agent)
        if gaps is None:
            gaps = chosen[agent] = self._gaps_after(state)
        return self._weight(state, gaps, step_gap)

    def _weight(self, state: WorkflowState, gaps: GapModel, step_gap: float) -> float:
        self.weights_computed += 1
        pauses = self.pauses
        if pauses is not None and (state.id in pauses.open or state.id in pauses.returned):
            due = pauses.due(state.id, self.now)  # the tool's residual duration, not the agent's gaps
            if due >= 0.0:
                return self.gamma ** (due / step_gap)
        return self.gamma ** (gaps.residual(self.now - state.last_seen) / step_gap)

    def _gaps_after(self, state: WorkflowState) -> GapModel:
        """What follows an agent's call (a tool run, or none) shapes the wait: that agent's gaps where there
        are enough of them, else every workflow's."""
        path = state.path
        gaps = self.gaps_after.get(path[-1]) if path else None
        return gaps if gaps is not None and gaps.count >= MIN_AGENT_GAPS else self.gaps


def _ewma(mean: float, sample: float, alpha: float = 0.05) -> float:
    return sample if mean == 0.0 else (1.0 - alpha) * mean + alpha * sample
