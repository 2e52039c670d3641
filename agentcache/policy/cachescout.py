"""CacheScout: online Markov-1 over agent transitions, BFS survival, recency and rebuild cost.

    P_ij = C_ij / sum_j C_ij                  (transition counts learned online)
    G_tau = { i -> j : P_ij >= tau }          (low-confidence edges pruned)
    E_w(a) = BFS hops from w's current agent to a's next call in G_tau
    p_w(a) = 1 - min(E_w(a), E_max) / E_max   (survival)
    S(c)   = max p_w(a) over the agents a that will read c: for an agent's
             fixed prompt any active workflow may call a; for a history node only
             the workflows that wrote it
    R      = visit-weighted mean of max_j P_ij  (predictability, in [0, 1])
    value  = r(c) * (1 - R + R * S(c) * cost(c))

with r(c) = 1 / (1 + idle(c) / T) a recency weight (T: the mean gap between a
workflow's requests, learned online) and cost(c) the node's tokens relative to
the mean node. At R = 0 the value orders nodes by recency alone, i.e. LRU; the
more predictable the workflows, the more survival and rebuild cost count.
Smallest value is evicted first.
"""

from __future__ import annotations

from collections import defaultdict, deque

from agentcache.policy.base import CacheNode, CachePolicy, node_tokens, tags_of
from agentcache.policy.workflows import WorkflowRegistry, WorkflowState


class CacheScoutPolicy(CachePolicy):
    name = "cachescout"

    def __init__(self, registry: WorkflowRegistry | None = None, tau: float = 0.1, max_hops: int = 4):
        super().__init__(registry)
        self.tau = tau
        self.max_hops = max_hops
        self.counts: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        self.mean_gap = 0.0  # EWMA of the gap between consecutive requests of one workflow
        self.mean_tokens = 0.0  # EWMA of tagged node sizes
        self._now = 0.0
        self._last_seen: dict[str, float] = {}
        self._version = -1
        self._survival_cache: dict[str, dict[str, float]] = {}
        self._any_caller: dict[str, float] = {}
        self._predictability = 0.0

    # -- learning

    def on_request(self, tags, now):  # noqa: ANN001 - same signature as the base
        self._now = now
        previous_seen = self.registry.get(tags.key)
        gap = now - previous_seen.last_seen if previous_seen is not None else None
        state = super().on_request(tags, now)
        if gap is not None:
            self.mean_gap = gap if self.mean_gap == 0.0 else 0.9 * self.mean_gap + 0.1 * gap
        return state

    def on_transition(self, state: WorkflowState, previous: str | None) -> None:
        if previous is not None:
            self.counts[previous][state.agent] += 1

    def tag_path(self, path, tags, now, matched_tokens, prompt_tokens=None):  # noqa: ANN001
        super().tag_path(path, tags, now, matched_tokens, prompt_tokens)
        for node in path:
            n = node_tokens(node)
            self.mean_tokens = n if self.mean_tokens == 0.0 else 0.99 * self.mean_tokens + 0.01 * n

    # -- model

    def predictability(self) -> float:
        visits = best = 0.0
        for row in self.counts.values():
            total = sum(row.values())
            visits += total
            best += max(row.values())
        return best / visits if visits else 0.0

    def _survival_from(self, current: str) -> dict[str, float]:
        """p(a) for every agent reachable from `current` within max_hops in the pruned graph."""
        hops: dict[str, int] = {}
        frontier = deque([(current, 0)])
        seen_start = False
        while frontier:
            agent, dist = frontier.popleft()
            if dist >= self.max_hops:
                continue
            row = self.counts.get(agent)
            if not row:
                continue
            total = sum(row.values())
            for nxt, c in row.items():
                if c / total < self.tau:
                    continue
                if nxt == current and not seen_start:
                    seen_start = True
                    hops[nxt] = dist + 1
                elif nxt != current and nxt not in hops:
                    hops[nxt] = dist + 1
                    frontier.append((nxt, dist + 1))
        return {a: 1.0 - min(e, self.max_hops) / self.max_hops for a, e in hops.items()}

    def _refresh(self) -> None:
        if self._version != self.registry.version:
            self._version = self.registry.version
            self._survival_cache = {}
            self._predictability = self.predictability()
            # An agent's fixed prompt survives as well as the most likely caller makes it.
            self._any_caller: dict[str, float] = {}
            for current in {state.agent for state in self.registry.active()}:
                for agent, p in self._table(current).items():
                    if p > self._any_caller.get(agent, 0.0):
                        self._any_caller[agent] = p

    def _table(self, current: str) -> dict[str, float]:
        table = self._survival_cache.get(current)
        if table is None:
            table = self._survival_cache[current] = self._survival_from(current)
        return table

    def survival(self, state: WorkflowState, agent: str) -> float:
        return self._table(state.agent).get(agent, 0.0) if state.agent is not None else 0.0

    # -- ranking

    def priority(self, node: CacheNode) -> tuple:
        t = tags_of(node)
        if t is None:
            return (0.0, node.last_access_time)
        self._refresh()
        s = 0.0
        if t.fixed_agents:
            s = max(self._any_caller.get(agent, 0.0) for agent in t.fixed_agents)
        else:
            for state, agents in self.active_workflows_of(t):
                for agent in agents:
                    s = max(s, self.survival(state, agent))
        idle = max(0.0, self._now - t.last_access)
        recency = 1.0 / (1.0 + idle / self.mean_gap) if self.mean_gap > 0 else 1.0
        cost = node_tokens(node) / self.mean_tokens if self.mean_tokens > 0 else 1.0
        r = self._predictability
        return (recency * (1.0 - r + r * s * cost), node.last_access_time)
