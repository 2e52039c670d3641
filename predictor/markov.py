"""Online order-N Markov predictor over agent transitions (CacheScout's learner, generalised).

Counts ``C[context][next]`` with context = the last N agents, a workflow's
path starting with a START marker so that its first agent is learned too
(``predict([])`` forecasts what a new workflow calls). The next-agent
distribution backs off from the longest context seen to shorter ones and, for
an unseen agent, to the global distribution of next agents, each mixed with
additive smoothing so no outcome that has ever been seen gets probability 0.
K-step rows come from rolling the chain forward over contexts, END absorbing.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from agentcache.predictor.base import END, START, Forecast, Predictor


class MarkovPredictor(Predictor):
    PRUNE = 1e-3  # rollout contexts below this mass merge into their order-1 suffix

    def __init__(self, order: int = 1, horizon: int = 3, smoothing: float = 0.5):
        super().__init__(horizon)
        if order < 1:
            raise ValueError(f"order must be >= 1, got {order}")
        self.order = order
        self.smoothing = smoothing
        self.name = "markov" if order == 1 else f"markov-{order}"
        # counts[context tuple] -> {next: count}; contexts of every length 1..order, and () for the global prior
        self.counts: dict[tuple[str, ...], dict[str, float]] = defaultdict(lambda: defaultdict(float))
        self.outcomes: dict[str, None] = {END: None}  # ordered: rows (and their sums) are the same in every process
        self._row_cache: dict[tuple[str, ...], dict[str, float]] = {}

    def _context(self, path: Sequence[str]) -> tuple[str, ...]:
        return ((START,) + tuple(path[-self.order :]))[-self.order :]

    def observe(self, path: Sequence[str], next_agent: str) -> None:
        if not path and next_agent == END:
            return  # a workflow that never called anything teaches nothing
        self.outcomes[next_agent] = None
        context = self._context(path)
        for n in range(0, len(context) + 1):
            self.counts[context[len(context) - n :]][next_agent] += 1.0
        self._row_cache.clear()

    def next_distribution(self, context: Sequence[str]) -> dict[str, float]:
        """P(next | context), backing off from the longest seen suffix of `context`."""
        key = tuple(context)
        cached = self._row_cache.get(key)
        if cached is not None:
            return cached
        # Back-off: start from the global prior, refine with each longer context that has data.
        dist = self._smoothed(self.counts.get((), {}), None)
        for n in range(1, len(key) + 1):
            counts = self.counts.get(key[len(key) - n :])
            if counts:
                dist = self._smoothed(counts, dist)
        self._row_cache[key] = dist
        return dist

    def _smoothed(self, counts: dict[str, float], prior: dict[str, float] | None) -> dict[str, float]:
        outcomes = self.outcomes
        total = sum(counts.values())
        alpha = self.smoothing * len(outcomes)
        if prior is None:
            prior = {o: 1.0 / len(outcomes) for o in outcomes}
        denom = total + alpha
        return {o: (counts.get(o, 0.0) + alpha * prior.get(o, 0.0)) / denom for o in outcomes}

    def predict(self, path: Sequence[str], hidden: Sequence[float] | None = None) -> Forecast:
        # Roll the chain forward over contexts (the last N agents), END absorbing. Contexts
        # holding less than PRUNE of the mass merge into their order-1 suffix, which keeps
        # every row summing to one while bounding the work per step.
        states: dict[tuple[str, ...], float] = {self._context(path): 1.0}
        ended = 0.0
        rows: Forecast = []
        for _ in range(self.horizon):
            row: dict[str, float] = defaultdict(float)
            row[END] = ended
            nxt: dict[tuple[str, ...], float] = defaultdict(float)
            for context, p in states.items():
                for agent, q in self.next_distribution(context).items():
                    pq = p * q
                    row[agent] += pq
                    if agent == END:
                        ended += pq
                    else:
                        nxt[(context + (agent,))[-self.order :]] += pq
            rows.append(dict(row))
            states = {}
            for context, p in nxt.items():
                key = context if p >= self.PRUNE or len(context) == 1 else context[-1:]
                states[key] = states.get(key, 0.0) + p
        return rows
