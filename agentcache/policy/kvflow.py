"""KVFlow: steps-to-execution over a static Agent Step Graph.

Each agent's steps-to-execution E(b) is how many steps away its next call is,
given the agent that just ran. It is aggregated over b's predecessors p as

    OR-branch (b runs after any p):  E(b) = min_p E(p) + 1
    AND-join  (b waits for every p): E(b) = max_p E(p) + 1

Every node on an agent's fixed prompt gets priority E of that agent, the
minimum over agents sharing the node and over active workflows (KVFlow's
min-propagation and conservative multi-workflow rule); dynamic suffixes get the
worst priority. Eviction takes the largest E first, LRU within ties.
Weakness, by design: it trusts the static graph, so runtime loops and
branches it cannot see break it.

On a server with tenant keys an agent's identity is scoped by its key's holder; the one graph serves every
tenant by the agents' unscoped names, and a workflow's position counts only for its own tenant's agents.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from functools import lru_cache

from agentcache.policy.base import CachePolicy
from agentcache.policy.nodes import CacheNode, tags_of
from agentcache.policy.workflows import WorkflowRegistry, WorkflowState
from agentcache.predictor.base import AgentCoverage
from agentcache.tags import split_agent

UNREACHABLE = math.inf


class AgentStepGraph:
    """A static call graph: agent -> successors, each agent an OR-branch unless named in `and_joins`."""

    learns_online = False

    def __init__(
        self, successors: Mapping[str, Sequence[str]], and_joins: Sequence[str] = (), source: str = "the call graph"
    ):
        self.source = source
        self.agents = sorted(set(successors) | {b for succ in successors.values() for b in succ})
        self.predecessors: dict[str, list[str]] = {a: [] for a in self.agents}
        for a, succ in successors.items():
            for b in succ:
                self.predecessors[b].append(a)
        self.and_joins = frozenset(and_joins)
        self.steps_from = lru_cache(maxsize=None)(self._steps_from)

    def knows(self, agent: str) -> bool:
        return agent in self.predecessors

    def known_agents(self) -> list[str]:
        return self.agents

    def _steps_from(self, current: str) -> dict[str, float]:
        """E(b) for every agent b after `current` ran; the current agent's own E is its next return."""
        steps = {a: UNREACHABLE for a in self.agents}
        # Fixed-point iteration: E values only decrease for OR agents and settle within |V| rounds;
        # a start marker stands for "current just ran" so that cycles back to `current` count.
        for _ in range(len(self.agents) + 1):
            changed = False
            for b in self.agents:
                preds = [0.0 if p == current else steps[p] for p in self.predecessors[b]]
                if not preds:
                    continue
                if b in self.and_joins:
                    value = max(preds) + 1
                else:
                    value = min(preds) + 1
                if value < steps[b]:
                    steps[b] = value
                    changed = True
            if not changed:
                break
        return steps


class KVFlowPolicy(CachePolicy):
    name = "kvflow"

    def __init__(self, graph: AgentStepGraph, registry: WorkflowRegistry | None = None):
        super().__init__(registry)
        self.graph = graph
        self.coverage = AgentCoverage("call graph", graph.source)
        self._steps_cache: dict[str, float] = {}
        self._cache_version = -1

    def on_transition(self, state: WorkflowState, previous: str | None) -> None:
        # E of every agent is read from where the workflow is now, by its unscoped name
        self.coverage.count(self.graph, split_agent(state.agent)[1] if state.agent is not None else None)

    def coverages(self) -> list[AgentCoverage]:
        return [self.coverage]

    def agent_steps(self, agent: str) -> float:
        """min over its tenant's active workflows of E(agent)."""
        principal, name = split_agent(agent)
        best = UNREACHABLE
        for state in self.registry.active():
            if state.agent is None:
                continue
            at_principal, at = split_agent(state.agent)
            if at_principal == principal and at in self.graph.predecessors:
                best = min(best, self.graph.steps_from(at).get(name, UNREACHABLE))
        return best

    def priority(self, node: CacheNode) -> tuple:
        t = tags_of(node)
        if t is None or not t.fixed_agents:
            return (0, 0.0, node.last_access_time)
        steps = min(self._cached_steps(a) for a in t.fixed_agents)
        return (1, -steps, node.last_access_time)

    def _cached_steps(self, agent: str) -> float:
        # The registry's version changes with every request and end event, so a cache keyed
        # on it is exact and spares recomputing E for every leaf of one eviction round.
        if self._cache_version != self.registry.version:
            self._cache_version = self.registry.version
            self._steps_cache = {}
        value = self._steps_cache.get(agent)
        if value is None:
            value = self._steps_cache[agent] = self.agent_steps(agent)
        return value
