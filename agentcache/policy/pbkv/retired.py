"""What retired cache (touched only by ended workflows) is worth: how often it is read again (RetiredReads,
the `retired_evidence` ingredient) and at which ages (RetiredAges, `retired_ages`)."""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Iterable

from agentcache.policy.base import NodeTags
from agentcache.policy.pbkv.reuse import REUSE_PRIOR, agent_counts

# Retired nodes' ages (RetiredAges): told apart in half-octaves above AGE_RESOLUTION_S, in AGE_BUCKETS buckets
# (the last one reaches past a century); the evidence is halved every AGE_HALF_EVENTS reads and evictions, so
# the curves follow a workload that changes.
AGE_RESOLUTION_S = 0.05
AGE_BUCKETS = 64
AGE_HALF_EVENTS = 4096


class RetiredReads:
    """How often cache that only ended workflows wrote is read again, per agent that wrote it: reads of
    retired nodes (fixed prompts aside) per node retired. Agent workflows rarely read what another, ended,
    workflow wrote (a fact that outranks an estimate: retired cache goes first); a chat's next turn, a
    workflow of its own, reads its previous turn's. An agent's share starts at 0, as if REUSE_PRIOR of its
    nodes had been retired and never read (no evidence: the paper's rule holds); bounded in agents (the
    least recently counted forgotten)."""

    def __init__(self) -> None:
        self._counts: OrderedDict[str, list[int]] = OrderedDict()  # agent -> [reads, nodes retired]
        self._retired = 0
        # What share() answers from, as of the last freeze(): keys must not move between two of the policy's
        # epochs unannounced.
        self._shares: dict[str, float] = {}
        self._frozen_retired = 0

    def read(self, agents: Iterable[str]) -> None:
        for agent in agents:
            self._count(agent)[0] += 1

    def retired(self, agents: Iterable[str]) -> None:
        self._retired += 1
        for agent in agents:
            self._count(agent)[1] += 1

    def _count(self, agent: str) -> list[int]:
        return agent_counts(self._counts, agent, lambda: [0, 0])

    def freeze(self) -> None:
        self._shares = {a: r / (n + REUSE_PRIOR) for a, (r, n) in self._counts.items() if r}
        self._frozen_retired = self._retired

    def doubled(self) -> bool:
        """Whether the nodes retired doubled since the last freeze (early on, evidence is worth freezing often)."""
        return self._retired > 2 * self._frozen_retired

    def share(self, agents: Iterable[str]) -> float:
        """Reads per node retired of the agents' retired cache (the most any of them has)."""
        shares = self._shares
        if not shares:  # no retired cache was ever read again: agent workflows
            return 0.0
        return max((shares.get(a, 0.0) for a in agents), default=0.0)

    def share_of(self, t: NodeTags) -> float:
        """share() for the agents of the workflow that touched `t` last (asked for every key computed: where no
        retired cache was ever read again, without looking them up)."""
        return self.share(latest_agents(t)) if self._shares else 0.0


class RetiredAges:
    """What a retired node's age says it is worth, per agent that wrote it: the chance that a retired node of
    that agent and age is read again before it is evicted, learned from the retired nodes read and evicted
    at each age (EVA's hit probability; Beckmann and Sanchez, "Maximizing Cache Performance Under
    Uncertainty", HPCA 2017).

    LRU evicts the retired node idle longest. Where conversations come back after a pause and more of them
    are live than the cache holds (chat under pressure), that is the node about to be read: every
    conversation is evicted just before its next turn, and none is read again. Ranked by this chance, the
    nodes that outlived the cache's turnover (read for certain once they did) outrank young ones, so some
    conversations stay whole; where returns come soon or never (a cache that holds the live ones), the
    chance falls with age and the order is LRU's. EVA also charges a node its expected remaining lifetime;
    measured on lifetimes the policy itself cuts short, that charge made the oldest nodes (evicted soon
    anyway) look nearly free to keep, and lost 1.3 points on chat at 16x the mean prompt. Evidence is
    counted in tokens by age bucket (half-octaves above AGE_RESOLUTION_S), halved every AGE_HALF_EVENTS
    events; an agent without evidence of its own is valued by every agent's. The chances are frozen at each
    of the policy's refreshes and read by a key when it is computed (its node touched, its age in a new
    bucket, a new epoch). Until a retired node is read again (agent workflows) every value is 0 and the
    tier stays LRU."""

    def __init__(self) -> None:
        # agent -> [tokens read again per age bucket, tokens evicted per age bucket]; least recent first
        self._counts: OrderedDict[str, tuple[list[float], list[float]]] = OrderedDict()
        self._all = ([0.0] * AGE_BUCKETS, [0.0] * AGE_BUCKETS)
        self._events = 0
        self._changed: set[str] = set()  # agents counted since the last freeze
        # What value() answers from, as of the last freeze(): per age bucket, the chance of a read before
        # eviction, per agent and every agent's (None: no read yet).
        self._chances: dict[str, list[float]] = {}
        self._chance: list[float] | None = None

    @property
    def learned(self) -> bool:
        """Whether some retired node was read again (before the last freeze): else every value is 0."""
        return self._chance is not None

    @staticmethod
    def bucket(age: float) -> int:
        return min(AGE_BUCKETS - 1, int(2.0 * math.log2(1.0 + max(0.0, age) / AGE_RESOLUTION_S)))

    @classmethod
    def bucket_end(cls, age: float) -> float:
        """The age at which `age`'s bucket ends (infinite for the last)."""
        b = cls.bucket(age)
        return math.inf if b == AGE_BUCKETS - 1 else AGE_RESOLUTION_S * (2.0 ** ((b + 1) / 2.0) - 1.0)

    def read(self, agents: Iterable[str], age: float, tokens: int) -> None:
        self._count(0, agents, age, tokens)

    def evicted(self, agents: Iterable[str], age: float, tokens: int) -> None:
        self._count(1, agents, age, tokens)

    def _count(self, kind: int, agents: Iterable[str], age: float, tokens: int) -> None:
        b = self.bucket(age)
        self._all[kind][b] += tokens
        for agent in agents:
            counts = agent_counts(self._counts, agent, lambda: ([0.0] * AGE_BUCKETS, [0.0] * AGE_BUCKETS))
            counts[kind][b] += tokens
            self._changed.add(agent)
        self._events += 1
        if self._events % AGE_HALF_EVENTS == 0:  # halving moves no chance: only the weight of what comes next
            for reads, evictions in (self._all, *self._counts.values()):
                for i in range(AGE_BUCKETS):
                    reads[i] *= 0.5
                    evictions[i] *= 0.5

    def freeze(self) -> None:
        """Recompute the chances of every agent counted since the last freeze, and every agent's."""
        if not any(self._all[0]):
            self._chance, self._chances = None, {}
            self._changed.clear()
            return
        self._chance = _read_chances(*self._all)
        chances, counts = self._chances, self._counts
        for agent in self._changed:
            of_agent = counts.get(agent)
            if of_agent is not None:
                chances[agent] = _read_chances(*of_agent)
        if len(chances) > len(counts):  # agents forgotten by the counts
            self._chances = {agent: chances[agent] for agent in counts if agent in chances}
        self._changed.clear()

    def value(self, agents: Iterable[str], age: float) -> float:
        """The chance that a retired node of `agents` at `age` is read before it is evicted (the most any of
        them gives; every agent's for an agent without evidence of its own)."""
        chance = self._chance
        if chance is None:
            return 0.0
        b, chances = self.bucket(age), self._chances
        return max((chances.get(agent, chance)[b] for agent in agents), default=chance[b])


def _read_chances(reads: list[float], evictions: list[float]) -> list[float]:
    """Per age bucket, the share of the tokens that reached that age which were read before eviction. A
    bucket no token reached takes the next older one's (0 past the oldest)."""
    chances = [0.0] * AGE_BUCKETS
    read_after = ended_after = chance = 0.0
    for b in range(AGE_BUCKETS - 1, -1, -1):
        read_after += reads[b]
        ended_after += reads[b] + evictions[b]
        if ended_after > 0.0:
            chance = read_after / ended_after
        chances[b] = chance
    return chances


def latest_agents(t: NodeTags) -> Iterable[str]:
    """The agents of the workflow that touched `t` last."""
    return next(reversed(t.workflows.values()), ())
