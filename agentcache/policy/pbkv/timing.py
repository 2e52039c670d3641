"""pbkv's clock and the timing weight phi_w: how soon a workflow calls again, learned from the gaps between a
workflow's requests and the time between new workflows.

A gap counts from the earlier request's arrival, so it holds the time that request took to generate its output,
which grows with the output's length: a workflow whose last request wrote a long answer is not idle yet where
one that wrote a line is. The gaps' share per generated token is learned (DecodeTime); the rest of each gap
(the tool run or the app's own work that follows) is what the gap distributions hold, and a workflow's wait
counts from when its last output is expected done."""

from __future__ import annotations

from collections import deque

from agentcache.policy.gaps import GapModel
from agentcache.policy.nodes import NO_LATEST, Latest
from agentcache.policy.pauses import Pauses
from agentcache.policy.workflows import WorkflowState
from agentcache.tags import WorkflowKey

MAX_GAP_MODELS = 1024  # agents whose gap distribution is kept
PER_AGENT_GAPS = 128  # recent gaps kept per agent
MIN_AGENT_GAPS = 8  # fewer than this: use every workflow's gaps


class Timing:
    def __init__(
        self,
        gamma: float,
        timed: bool,
        pauses: Pauses | None = None,
        latest: dict[WorkflowKey, dict[str, Latest]] | None = None,
    ) -> None:
        self.gamma = gamma
        self.timed = timed  # the `timing` ingredient: else every weight is 1
        # The `tools` ingredient: a workflow whose agent waits on a tool is due when the tool returns.
        self.pauses = pauses
        self.now = 0.0  # the policy clock, at the latest request
        self.gaps = GapModel()  # gaps between a workflow's consecutive requests (a step's length)
        # The policy's latest paths (CachePolicy.latest): how many tokens each workflow's last request generated.
        self.latest = latest if latest is not None else {}
        self.decode = DecodeTime()
        # The gaps less their generating time: every workflow's, and by the agent of the earlier request.
        self.waits = GapModel()
        self.gaps_after: dict[str, GapModel] = {}
        self.arrival_gap = 0.0  # EWMA of the time between new workflows (1 / lambda)
        self._last_start: float | None = None
        self.weights_computed = 0  # for benchmarks and tests

    def observe(self, known: WorkflowState | None, now: float) -> None:
        """A request of the workflow `known` (None: a new one) arrived at `now`."""
        if known is not None:
            gap = now - known.last_seen
            self.gaps.add(gap)
            generated = self.generated(known)
            self.decode.add(generated, gap)
            gap = max(0.0, gap - self.decode.per_token * generated)
            self.waits.add(gap)
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
        """lambda * g: new workflows per step of a workflow (0 until both are known). The time since the last
        workflow started is a gap at least that long: where arrivals stop, the rate falls with it."""
        step_gap = self.gaps.mean
        if self.arrival_gap <= 0.0 or step_gap <= 0.0 or self._last_start is None:
            return 0.0
        return step_gap / max(self.arrival_gap, self.now - self._last_start)

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
        # While its request runs, its output's length is not known yet: the mean output's time.
        tokens = self.decode.mean_tokens if state.in_flight else self.generated(state)
        idle = self.now - state.last_seen - self.decode.per_token * tokens  # < 0: still generating
        return self.gamma ** (gaps.residual(idle) / step_gap)

    def pause_weight(self, workflow: WorkflowKey) -> float:
        """gamma^(due / g) for a workflow whose next caller waits on a tool (or is back from one): how soon the
        tool's learned duration says that call comes; -1.0 where no agent of it waits (or pauses go unheard)."""
        pauses = self.pauses
        if pauses is None or not (workflow in pauses.open or workflow in pauses.returned):
            return -1.0
        due = pauses.due(workflow, self.now)
        if due < 0.0:
            return -1.0
        step_gap = self.gaps.mean
        return self.gamma ** (due / step_gap) if self.timed and step_gap > 0.0 else 1.0

    def _gaps_after(self, state: WorkflowState) -> GapModel:
        """What follows an agent's call (a tool run, or none) shapes the wait: that agent's gaps where there
        are enough of them, else every workflow's."""
        path = state.path
        gaps = self.gaps_after.get(path[-1]) if path else None
        return gaps if gaps is not None and gaps.count >= MIN_AGENT_GAPS else self.waits

    def generated(self, state: WorkflowState) -> int:
        """The tokens the workflow's last request generated (0 until it finished)."""
        agent = state.agent
        pair = self.latest.get(state.id, NO_LATEST).get(agent) if agent is not None else None
        return pair.depth - pair.prompt if pair is not None and pair.prompt is not None else 0


class DecodeTime:
    """Seconds per generated token in the gap after a request: the least-squares slope of the gaps on the
    earlier requests' output tokens over the last `window` gaps; 0 where it is not positive (nothing says the
    output's length shows in the gaps: the replay of a trace whose gaps do not hold it, or too few gaps)."""

    def __init__(self, window: int = 512) -> None:
        self.window = window
        self._recent: deque[tuple[float, float]] = deque()
        self._sums = [0.0] * 5  # count, sum of tokens, of gaps, of tokens squared, of tokens x gaps
        self.per_token = 0.0
        self.mean_tokens = 0.0

    def add(self, tokens: int, gap: float) -> None:
        x = float(tokens)
        self._recent.append((x, gap))
        sums = self._sums
        _add(sums, x, gap, 1.0)
        if len(self._recent) > self.window:
            old_x, old_gap = self._recent.popleft()
            _add(sums, old_x, old_gap, -1.0)
        n, sx, sy, sxx, sxy = sums
        spread = n * sxx - sx * sx
        slope = (n * sxy - sx * sy) / spread if n > 1.0 and spread > 0.0 else 0.0
        self.per_token = slope if slope > 0.0 else 0.0
        self.mean_tokens = sx / n if n > 0.0 else 0.0


def _add(sums: list[float], x: float, y: float, sign: float) -> None:
    sums[0] += sign
    sums[1] += sign * x
    sums[2] += sign * y
    sums[3] += sign * x * x
    sums[4] += sign * x * y


def _ewma(mean: float, sample: float, alpha: float = 0.05) -> float:
    return sample if mean == 0.0 else (1.0 - alpha) * mean + alpha * sample
