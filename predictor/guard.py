"""A predictor that cannot break the cache: faults fall back to a simple forecaster, and are counted.

The policy calls the predictor on the scheduler's hot path. A predictor that
raises, returns something that is not a forecast (wrong length, negative or
non-finite probabilities, rows not summing to one), or takes longer than its
time budget is replaced, for that decision, by the fallback (an online
Markov-1 that learns from the same transitions). The time budget is off
where decisions must be identical across tensor-parallel ranks: a clock is
not the same on every rank, an exception is.

Most predictors never fault, so the fallback learns only once first needed:
until then the guard keeps the last MAX_UNTAUGHT transitions (of each, what a
Markov-1 reads: the agent before and the next) and teaches it those, then
every later one.
"""

from __future__ import annotations

import math
import time
from collections import Counter, deque
from collections.abc import Sequence

from agentcache.predictor.base import AgentCoverage, Forecast, PerForecast, Predictor
from agentcache.predictor.markov import MarkovPredictor

TOLERANCE = 1e-3
MAX_CHECKED = 1024  # forecasts remembered as checked (predictors keep theirs per context and return them again)
ONLY_FLOATS = frozenset((float,))
MAX_UNTAUGHT = 4096  # transitions kept for the fallback until it is first needed


def is_forecast(rows: object, horizon: int) -> bool:
    if not isinstance(rows, list) or len(rows) != horizon:
        return False
    for row in rows:
        if not isinstance(row, dict) or not row:
            return False
        probabilities = row.values()
        # Checked by C loops (a forecast is checked at every re-roll): a NaN or an infinity makes the sum
        # non-finite.
        if not ONLY_FLOATS.issuperset(map(type, probabilities)) and not all(
            isinstance(p, float | int) for p in probabilities
        ):
            return False
        try:
            # A float start: summed as floats (an int too large for one raises here), and typed so for mypyc.
            total, lowest = sum(probabilities, 0.0), min(probabilities)
        except (ArithmeticError, ValueError):  # an int too large for a float beside a float, say
            return False
        if not (lowest >= 0.0 and math.isfinite(total) and abs(total - 1.0) <= TOLERANCE):
            return False
    return True


class GuardedPredictor(Predictor):
    def __init__(self, inner: Predictor, budget_ms: float | None = 10.0):
        super().__init__(inner.horizon)
        self.inner = inner
        self.fallback = MarkovPredictor(order=1, horizon=inner.horizon)
        # The transitions not taught to the fallback yet, as what its order 1 reads of each: the agent before
        # (None: the workflow's start) and the next agent, two strings per transition (no object kept per
        # transition). None once it was needed: it learns each transition as it comes from then on.
        self._untaught: tuple[deque[str | None], deque[str]] | None = (
            deque(maxlen=MAX_UNTAUGHT),
            deque(maxlen=MAX_UNTAUGHT),
        )
        self.budget_ms = budget_ms
        self.name = getattr(inner, "name", "predictor")
        self.faults: Counter[str] = Counter()  # error, invalid, overrun
        self.coverage = AgentCoverage(self.name, inner.source or f"the online {self.name} forecaster")
        self._checked: PerForecast[bool] = PerForecast(MAX_CHECKED)

    def predict(self, path: Sequence[str], hidden: Sequence[float] | None = None) -> Forecast:
        self.coverage.count(self.inner, path[-1] if path else None)
        if self.inner.offline:  # a replay's perfect forecasts: no budget, and a fault must stop the replay
            return self.inner.predict(path, hidden)
        budget_ms = self.budget_ms
        started = time.perf_counter() if budget_ms is not None else 0.0
        try:
            rows = self.inner.predict(path, hidden)
        except Exception:
            self.faults["error"] += 1
            return self._taught_fallback().predict(path, hidden)
        if budget_ms is not None and (time.perf_counter() - started) * 1000.0 > budget_ms:
            self.faults["overrun"] += 1
            return self._taught_fallback().predict(path, hidden)
        if self._checked.get(rows) is None:
            if not is_forecast(rows, self.horizon):
                self.faults["invalid"] += 1
                return self._taught_fallback().predict(path, hidden)
            self._checked.put(rows, True)
        return rows

    def _taught_fallback(self) -> MarkovPredictor:
        """The fallback, at a fault: taught first what it was not taught yet."""
        untaught = self._untaught
        if untaught is not None:
            self._untaught = None
            for before, next_agent in zip(*untaught):
                self.fallback.observe(() if before is None else (before,), next_agent)
        return self.fallback

    def observe(self, path: Sequence[str], next_agent: str) -> None:
        untaught = self._untaught
        if untaught is None:
            self.fallback.observe(path, next_agent)
        else:
            untaught[0].append(path[-1] if path else None)
            untaught[1].append(next_agent)
        if self.inner.offline:
            self.inner.observe(path, next_agent)
            return
        try:
            self.inner.observe(path, next_agent)
        except Exception:
            self.faults["error"] += 1
