"""One forecaster per tenant on a server with tenant keys: no tenant's agents or transitions move another's.

On the live server an agent's identity is scoped by the principal of its tenant (agentcache.tags.scoped_agent:
the keys file's tenant name, "" for the operator). A forecaster that learns online (markov) keeps a bounded
number of agents and smooths over all it keeps, so one instance shared by every tenant would let one tenant's
flood of agent names push another's agents out, and its transitions ("planner, then END") lower another's
forecasts. Here each principal learns in an instance of its own, a copy of the forecaster as configured,
made on the principal's first request (principals come from the keys file, so they are few). A forecaster
with a fixed set of agents (a call graph, a trained model) learns nothing from tenants: one serves them all,
reading each tenant's agents by their unscoped names.

The forecast for workflows not started yet (``predict([])``, the arrivals) mixes the principals' own,
weighted by the workflows each started.
"""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Collection, Sequence

from agentcache.predictor.base import END, Forecast, PerForecast, Predictor
from agentcache.tags import scoped_agent, split_agent

MAX_SCOPED_FORECASTS = 1024  # a shared forecaster's forecasts kept with a principal's agent names


class ScopedNames(Predictor):
    """A forecaster with a fixed set of agents, serving one principal: its agents by their unscoped names."""

    learns_online = False

    def __init__(self, inner: Predictor, principal: str):
        super().__init__(inner.horizon)
        self.inner, self.principal = inner, principal
        self.name, self.source = inner.name, inner.source
        self._scoped: PerForecast[Forecast] = PerForecast(MAX_SCOPED_FORECASTS)

    def predict(self, path: Sequence[str], hidden: Sequence[float] | None = None) -> Forecast:
        rows = self.inner.predict([split_agent(a)[1] for a in path], hidden)
        scoped = self._scoped.get(rows)
        if scoped is None:  # the same rows object back: the same scoped rows (forecasts are kept per object)
            principal = self.principal
            scoped = [{a if a == END else scoped_agent(principal, a): p for a, p in row.items()} for row in rows]
            self._scoped.put(rows, scoped)
        return scoped

    def observe(self, path: Sequence[str], next_agent: str) -> None:
        name = next_agent if next_agent == END else split_agent(next_agent)[1]
        self.inner.observe([split_agent(a)[1] for a in path], name)

    def knows(self, agent: str) -> bool:
        return self.inner.knows(split_agent(agent)[1])

    def known_agents(self) -> Collection[str]:
        return self.inner.known_agents()


class PerTenant(Predictor):
    """The forecaster of each principal, picked by the principal of the agents a workflow called."""

    def __init__(self, first: Predictor):
        super().__init__(first.horizon)
        self.name, self.source = first.name, first.source
        # An untrained copy for each principal to come (a fixed forecaster is shared instead).
        self._template = copy.deepcopy(first) if first.learns_online else None
        self._shared = first
        self._of: dict[str, Predictor] = {"": first}
        self._starts: Counter[str] = Counter()  # workflows each principal started: the arrivals' weights

    def of(self, principal: str) -> Predictor:
        forecaster = self._of.get(principal)
        if forecaster is None:
            template = self._template
            forecaster = copy.deepcopy(template) if template is not None else ScopedNames(self._shared, principal)
            self._of[principal] = forecaster
        return forecaster

    def predict(self, path: Sequence[str], hidden: Sequence[float] | None = None) -> Forecast:
        if path:
            return self.of(split_agent(path[-1])[0]).predict(path, hidden)
        started = [(p, n) for p, n in self._starts.items() if n]
        if len(started) <= 1:
            return self.of(started[0][0] if started else "").predict(path, hidden)
        total = float(sum(n for _, n in started))
        rows: Forecast = [{} for _ in range(self.horizon)]
        for principal, n in started:
            weight = n / total
            for row, theirs in zip(rows, self.of(principal).predict(path, hidden)):
                for agent, p in theirs.items():
                    row[agent] = row.get(agent, 0.0) + weight * p
        return rows

    def observe(self, path: Sequence[str], next_agent: str) -> None:
        if not path:
            if next_agent == END:
                return  # a workflow that called nothing teaches nothing
            principal = split_agent(next_agent)[0]
            self._starts[principal] += 1
        else:
            principal = split_agent(path[-1])[0]
        self.of(principal).observe(path, next_agent)

    def knows(self, agent: str) -> bool:
        principal, name = split_agent(agent)
        if self._template is None:
            return self._shared.knows(name)
        forecaster = self._of.get(principal)
        return forecaster is not None and forecaster.knows(agent)

    def known_agents(self) -> Collection[str]:
        return self._shared.known_agents() if self._template is None else self._of[""].known_agents()


class StaticPerTenant(PerTenant):
    learns_online = False


def per_tenant(forecaster: Predictor) -> Predictor:
    """`forecaster` (untrained, or fixed), one per principal from now on."""
    return PerTenant(forecaster) if forecaster.learns_online else StaticPerTenant(forecaster)
