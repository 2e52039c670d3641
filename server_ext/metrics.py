"""agentcache counters on SGLang's Prometheus `/metrics` (with `--enable-metrics`).

SGLang serves /metrics from a multiprocess collector over every process's
files in PROMETHEUS_MULTIPROC_DIR, so counters created here, in the scheduler,
appear there. Only tensor-parallel rank 0 exports, so ranks are not summed.
"""

from __future__ import annotations

import os


class Metrics:
    def __init__(self) -> None:
        from prometheus_client import Counter

        self.events = Counter("agentcache_events", "agentcache request and workflow events", ["event"])
        self.evicted_tokens = Counter(
            "agentcache_evicted_tokens", "tokens evicted from device, by node class", ["node_class"]
        )
        self.tokens = Counter(
            "agentcache_tokens", "prompt tokens of finished tagged requests, and those served from cache", ["kind"]
        )
        self.forecasts = Counter(
            "agentcache_forecasts",
            "forecasts per forecaster, by whether it knew the agent the workflow was at",
            ["forecaster", "agent"],
        )

    @classmethod
    def create(cls, tp_rank: int) -> Metrics | None:
        if tp_rank != 0 or not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            return None
        return cls()

    def event(self, name: str, n: int = 1) -> None:
        self.events.labels(event=name).inc(n)

    def evicted(self, node_class: str, tokens: int) -> None:
        self.evicted_tokens.labels(node_class=node_class).inc(tokens)

    def forecast(self, forecaster: str, agent: str) -> None:
        self.forecasts.labels(forecaster=forecaster, agent=agent).inc()

    def token(self, kind: str, n: int) -> None:
        if n:
            self.tokens.labels(kind=kind).inc(n)
