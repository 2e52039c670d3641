"""What retired cache (touched only by ended workflows) is worth: how often it is read again (RetiredReads,
the `retired_evidence` ingredient) and at which ages (RetiredAges, `retired_ages`)."""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Iterable

from agentcache.policy.nodes import NodeTags
from agentcache.policy.pbkv.reuse import REUSE_PRIOR, agent_counts

# Retired nodes' ages (RetiredAges): told apart in half-octaves above AGE_RESOLUTION_S, in AGE_BUCKETS buckets
# (the last one reaches past a century); the evidence is halved every AGE_HALF_EVENTS reads and evictions, so
# the curves follow a workload that changes.
AGE_RESOLUTION_S = 0.05
AGE_BUCKETS = 64
AGE_HALF_EVENTS = 4096
# Reuse classes (RetiredAges.reuse_class): nodes where at most 1, 2-3, 4-7, 8 or more requests' cached prefixes
# ended. A shared prefix's age is counted in its own mean interval between such reads, at least MIN_AGE_UNIT_S.
REUSE_CLASSES = 4
MIN_AGE_UNIT_S = AGE_RESOLUTION_S


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
        # agent -> [tokens read again, tokens evicted], each per (reuse class, age bucket) at
        # class * AGE_BUCKETS + bucket; least recent first
        self._counts: OrderedDict[str, tuple[list[float], list[float]]] = OrderedDict()
        self._all = _no_counts()
        self._events = 0
        self._changed: set[str] = set()  # agents counted since the last freeze
        # What value() answers from, as of the last freeze(): per reuse class, the chance of a read before
        # eviction per age bucket (None: no evidence in that class), per agent and every agent's; and every
        # agent's over all classes (None: no read yet), for a class without any evidence.
        self._chances: dict[str, list[list[float] | None]] = {}
        self._by_class: list[list[float] | None] = [None] * REUSE_CLASSES
        self._chance: list[float] | None = None

    @property
    def learned(self) -> bool:
        """Whether some retired node was read again (before the last freeze): else every value is 0."""
        return self._chance is not None

    @staticmethod
    def bucket(age: float) -> int:
        return min(AGE_BUCKETS - 1, int(2.0 * math.log2(1.0 + max(0.0, age) / AGE_RESOLUTION_S)))

    @staticmethod
    def reuse_class(stops: int) -> int:
        """A node's reuse class by the requests whose cached prefix ended at it: at most 1, 2-3, 4-7, 8 or more."""
        return min(REUSE_CLASSES - 1, max(0, stops.bit_length() - 1))

    @staticmethod
    def age_unit(t: NodeTags) -> float:
        """What a node's age is counted in: seconds, but for a prefix where several requests' cached prefixes
        ended (a shared prefix, not one conversation's chain) its own mean interval between those reads, so
        that a prefix read every few minutes is as young at two minutes idle as one read every few seconds is
        at two seconds, and both outlast the cache's turnover as long as their readers keep coming."""
        if t.stops < 2:
            return 1.0
        interval = (t.last_access - t.created) / t.stops
        return interval if interval > MIN_AGE_UNIT_S else MIN_AGE_UNIT_S

    @classmethod
    def bucket_end(cls, age: float) -> float:
        """The age at which `age`'s bucket ends (infinite for the last)."""
        b = cls.bucket(age)
        return math.inf if b == AGE_BUCKETS - 1 else AGE_RESOLUTION_S * (2.0 ** ((b + 1) / 2.0) - 1.0)

    def read(self, agents: Iterable[str], age: float, tokens: int, stops: int = 0) -> None:
        self._count(0, agents, age, tokens, stops)

    def evicted(self, agents: Iterable[str], age: float, tokens: int, stops: int = 0) -> None:
        self._count(1, agents, age, tokens, stops)

    def _count(self, kind: int, agents: Iterable[str], age: float, tokens: int, stops: int) -> None:
        b = self.reuse_class(stops) * AGE_BUCKETS + self.bucket(age)
        self._all[kind][b] += tokens
        for agent in agents:
            counts = agent_counts(self._counts, agent, _no_counts)
            counts[kind][b] += tokens
            self._changed.add(agent)
        self._events += 1
        if self._events % AGE_HALF_EVENTS == 0:  # halving moves no chance: only the weight of what comes next
            for reads, evictions in (self._all, *self._counts.values()):
                for i in range(len(reads)):
                    reads[i] *= 0.5
                    evictions[i] *= 0.5

    def freeze(self) -> None:
        """Recompute the chances of every agent counted since the last freeze, and every agent's."""
        reads, evictions = self._all
        if not any(reads):
            self._chance, self._chances, self._by_class = None, {}, [None] * REUSE_CLASSES
            self._changed.clear()
            return
        pooled_reads, pooled_evictions = [0.0] * AGE_BUCKETS, [0.0] * AGE_BUCKETS
        for c in range(REUSE_CLASSES):
            for b in range(AGE_BUCKETS):
                pooled_reads[b] += reads[c * AGE_BUCKETS + b]
                pooled_evictions[b] += evictions[c * AGE_BUCKETS + b]
        self._chance = _read_chances(pooled_reads, pooled_evictions)
        self._by_class = _class_chances(self._all)
        chances, counts = self._chances, self._counts
        for agent in self._changed:
            of_agent = counts.get(agent)
            if of_agent is not None:
                chances[agent] = _class_chances(of_agent)
        if len(chances) > len(counts):  # agents forgotten by the counts
            self._chances = {agent: chances[agent] for agent in counts if agent in chances}
        self._changed.clear()

    def value(self, agents: Iterable[str], age: float, stops: int = 0) -> float:
        """The chance that a retired node of `agents` at `age` (in its age_unit), where `stops` requests' cached
        prefixes ended, is read before it is evicted (the most any of them gives). An agent without evidence of
        its own in the node's reuse class takes every agent's; a class without any evidence, every class's."""
        chance = self._chance
        if chance is None:
            return 0.0
        c, b = self.reuse_class(stops), self.bucket(age)
        fallback = self._by_class[c] or chance
        chances, best, any_agent = self._chances, 0.0, False
        for agent in agents:
            any_agent = True
            of_agent = chances.get(agent)
            curve = (of_agent[c] if of_agent is not None else None) or fallback
            if curve[b] > best:
                best = curve[b]
        return best if any_agent else fallback[b]


def _no_counts() -> tuple[list[float], list[float]]:
    return [0.0] * (REUSE_CLASSES * AGE_BUCKETS), [0.0] * (REUSE_CLASSES * AGE_BUCKETS)


def _class_chances(counts: tuple[list[float], list[float]]) -> list[list[float] | None]:
    """Per reuse class, _read_chances of its age buckets (None for a class without any evidence)."""
    reads, evictions = counts
    out: list[list[float] | None] = []
    for c in range(REUSE_CLASSES):
        lo, hi = c * AGE_BUCKETS, (c + 1) * AGE_BUCKETS
        seen = any(reads[lo:hi]) or any(evictions[lo:hi])
        out.append(_read_chances(reads[lo:hi], evictions[lo:hi]) if seen else None)
    return out


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
