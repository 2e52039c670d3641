"""Prediction noise for sweeps (PBKV's P~ = (1 - lam) P + lam U).

The mix is applied to each *unconditional* row: ``row'_k = (1 - lam) row_k + lam U``
with U uniform over the inner forecast's outcomes (every agent any row names,
and END). Rows stay distributions, and END stays non-decreasing because
row_k(END) is and U's END mass, 1/n, is the same every step: the result is the
mixture of the inner process and one that ends at once with probability 1/n and
otherwise calls uniform agents forever, both END-absorbing. It is also exactly
the perturbation PBKV's score sees, since the score reads s_w^(k) P_w^(k) = row_k.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agentcache.predictor.base import END, Forecast, Predictor


class NoisyPredictor(Predictor):
    def __init__(self, inner: Predictor, lam: float):
        if not 0.0 <= lam <= 1.0:
            raise ValueError(f"noise lam must be in [0, 1], got {lam}")
        super().__init__(inner.horizon)
        self.inner = inner
        self.lam = lam
        self.name = f"noise:{lam:g}:{inner.name}"
        self.source, self.learns_online = inner.source, inner.learns_online

    def predict(self, path: Sequence[str], hidden: Sequence[float] | None = None) -> Forecast:
        rows = self.inner.predict(path, hidden)
        outcomes = {END}.union(*rows)
        uniform = self.lam / len(outcomes)
        keep = 1.0 - self.lam
        return [{o: keep * row.get(o, 0.0) + uniform for o in outcomes} for row in rows]

    def observe(self, path: Sequence[str], next_agent: str) -> None:
        self.inner.observe(path, next_agent)

    def knows(self, agent: str) -> bool:
        return self.inner.knows(agent)

    def known_agents(self) -> Any:
        return self.inner.known_agents()
