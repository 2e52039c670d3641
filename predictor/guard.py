"""A predictor that cannot break the cache: faults fall back to a simple forecaster, and are counted.

The policy calls the predictor on the scheduler's hot path. A predictor that
raises, returns something that is not a forecast (wrong length, negative or
non-finite probabilities, rows not summing to one), or takes longer than its
time budget is replaced, for that decision, by the fallback (an online
Markov-1 that learns from the same transitions). The time budget is off
where decisions must be identical across tensor-parallel ranks: a clock is
not the same on every rank, an exception is.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Sequence

from agentcache.predictor.base import AgentCoverage, Forecast, PerForecast, Predictor
from agentcache.predictor.markov import MarkovPredictor

TOLERANCE = 1e-3
MAX_CHECKED = 1024  # forecasts remembered as checked (predictors keep theirs per context and return them again)


def is_forecast(rows: object, horizon: int) -> bool:
    if not isinstance(rows, list) or len(rows) != horizon:
        return False
    for row in rows:
        if not isinstance(row, dict) or not row:
            return False
        total = 0.0
        for p in row.values():
            if not isinstance(p, float | int) or not math.isfinite(p) or p < 0.0:
                return False
            total += p
        if abs(total - 1.0) > TOLERANCE:
            return False
    return True


class GuardedPredictor(Predictor):
    def __init__(self, inner: Predictor, fallback: Predictor | None = None, budget_ms: float | None = 10.0):
        super().__init__(inner.horizon)
        self.inner = inner
        self.fallback = fallback if fallback is not None else MarkovPredictor(order=1, horizon=inner.horizon)
        self.budget_ms = budget_ms
        self.name = getattr(inner, "name", "predictor")
        self.faults: Counter[str] = Counter()  # error, invalid, overrun
        self.coverage = AgentCoverage(self.name, inner.source or f"the online {self.name} forecaster")
        self._checked: PerForecast[bool] = PerForecast(MAX_CHECKED)

    def predict(self, path: Sequence[str], hidden: Sequence[float] | None = None) -> Forecast:
        self.coverage.count(self.inner, path[-1] if path else None)
        if self.inner.offline:  # a replay's perfect forecasts: no budget, and a fault must stop the replay
            return self.inner.predict(path, hidden)
        started = time.perf_counter()
        try:
            rows = self.inner.predict(path, hidden)
        except Exception:
            self.faults["error"] += 1
            return self.fallback.predict(path, hidden)
        if self.budget_ms is not None and (time.perf_counter() - started) * 1000.0 > self.budget_ms:
            self.faults["overrun"] += 1
            return self.fallback.predict(path, hidden)
        if self._checked.get(rows) is None:
            if not is_forecast(rows, self.horizon):
                self.faults["invalid"] += 1
                return self.fallback.predict(path, hidden)
            self._checked.put(rows, True)
        return rows

    def observe(self, path: Sequence[str], next_agent: str) -> None:
        self.fallback.observe(path, next_agent)
        if self.inner.offline:
            self.inner.observe(path, next_agent)
            return
        try:
            self.inner.observe(path, next_agent)
        except Exception:
            self.faults["error"] += 1
