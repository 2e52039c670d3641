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

On a server with tenant keys each key holder (principal) has a learner of its own (its transitions, its R,
its mean gap), holding at most MAX_AGENTS agents: no tenant's traffic moves another's ranking or grows the
policy's memory without bound.
"""

from __future__ import annotations

from collections import deque

from agentcache.policy.base import CachePolicy
from agentcache.policy.nodes import CacheNode, node_tokens, tags_of
from agentcache.policy.workflows import WorkflowRegistry, WorkflowState
from agentcache.tags import principal_of, split_agent

# Agents one principal's learner keeps, the most recently seen; past it the least recent go, down to three
# quarters (once per quarter of new agents), so a client naming a new agent at every call stays bounded.
MAX_AGENTS = 64


class TransitionLearner:
    """One principal's transition counts, predictability and mean gap between a workflow's requests."""

    def __init__(self) -> None:
        self.counts: dict[str, dict[str, int]] = {}
        self.seen: dict[str, None] = {}  # agents, least recently seen first
        self.mean_gap = 0.0
        self.predictability = 0.0

    def observe(self, previous: str, agent: str) -> None:
        row = self.counts.setdefault(previous, {})
        row[agent] = row.get(agent, 0) + 1
        for a in (previous, agent):
            self.seen.pop(a, None)
            self.seen[a] = None
        if len(self.seen) > MAX_AGENTS:
            self._forget(len(self.seen) - MAX_AGENTS * 3 // 4)

    def _forget(self, n: int) -> None:
        gone = set(list(self.seen)[:n])
        for agent in gone:
            del self.seen[agent]
            self.counts.pop(agent, None)
        for previous in list(self.counts):
            row = self.counts[previous]
            for agent in gone & row.keys():
                del row[agent]
            if not row:
                del self.counts[previous]

    def observe_gap(self, gap: float) -> None:
        self.mean_gap = gap if self.mean_gap == 0.0 else 0.9 * self.mean_gap + 0.1 * gap

    def measure_predictability(self) -> float:
        visits = best = 0.0
        for row in self.counts.values():
            total = sum(row.values())
            visits += total
            best += max(row.values())
        self.predictability = best / visits if visits else 0.0
        return self.predictability


class CacheScoutPolicy(CachePolicy):
    name = "cachescout"

    def __init__(self, registry: WorkflowRegistry | None = None, tau: float = 0.1, max_hops: int = 4):
        super().__init__(registry)
        self.tau = tau
        self.max_hops = max_hops
        self.learners: dict[str, TransitionLearner] = {}  # per principal ("" the operator's); the keys file bounds them
        self.mean_tokens = 0.0  # EWMA of tagged node sizes
        self._now = 0.0
        self._version = -1
        self._survival_cache: dict[str, dict[str, float]] = {}
        self._any_caller: dict[str, float] = {}

    def learner(self, principal: str) -> TransitionLearner:
        learner = self.learners.get(principal)
        if learner is None:
            learner = self.learners[principal] = TransitionLearner()
        return learner

    # -- learning

    def on_request(self, tags, now):  # noqa: ANN001 - same signature as the base
        self._now = now
        previous_seen = self.registry.get(tags.key)
        gap = now - previous_seen.last_seen if previous_seen is not None else None
        state = super().on_request(tags, now)
        if gap is not None:
            self.learner(principal_of(tags.key.tenant)).observe_gap(gap)
        return state

    def on_transition(self, state: WorkflowState, previous: str | None) -> None:
        if previous is not None and state.agent is not None:
            self.learner(split_agent(state.agent)[0]).observe(previous, state.agent)

    def tag_path(self, path, tags, now, matched_tokens, prompt_tokens=None):  # noqa: ANN001
        super().tag_path(path, tags, now, matched_tokens, prompt_tokens)
        for node in path:
            n = node_tokens(node)
            self.mean_tokens = n if self.mean_tokens == 0.0 else 0.99 * self.mean_tokens + 0.01 * n

    # -- model

    def predictability(self, principal: str = "") -> float:
        return self.learner(principal).measure_predictability()

    def _survival_from(self, current: str) -> dict[str, float]:
        """p(a) for every agent reachable from `current` within max_hops in the pruned graph."""
        counts = self.learner(split_agent(current)[0]).counts
        hops: dict[str, int] = {}
        frontier = deque([(current, 0)])
        seen_start = False
        while frontier:
            agent, dist = frontier.popleft()
            if dist >= self.max_hops:
                continue
            row = counts.get(agent)
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
            for learner in self.learners.values():
                learner.measure_predictability()
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
        # (principal, survival) of every agent that may read c; c is kept as well as the best of them keeps it.
        readers: list[tuple[str, float]] = []
        if t.fixed_agents:
            readers = [(split_agent(a)[0], self._any_caller.get(a, 0.0)) for a in t.fixed_agents]
        else:
            for state, agents in self.active_workflows_of(t):
                principal = principal_of(state.id.tenant)
                readers += [(principal, self.survival(state, agent)) for agent in agents]
        if not readers:
            readers = [(principal_of(next(reversed(t.workflows)).tenant) if t.workflows else "", 0.0)]
        idle = max(0.0, self._now - t.last_access)
        cost = node_tokens(node) / self.mean_tokens if self.mean_tokens > 0 else 1.0
        value = 0.0
        for principal, s in readers:
            learner = self.learner(principal)
            recency = 1.0 / (1.0 + idle / learner.mean_gap) if learner.mean_gap > 0 else 1.0
            r = learner.predictability
            value = max(value, recency * (1.0 - r + r * s * cost))
        return (value, node.last_access_time)
