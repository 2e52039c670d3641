"""How much of its previous request's path an agent reads again (the `reuse` ingredient), and the per-agent
tables the evidence modules share."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any, Final

from agentcache.policy.nodes import CONTEXT, FRESH, OUTPUT, TAGS_ATTR, Latest, node_tokens, tags_of

MAX_REUSE_AGENTS = 1024  # agents whose reuse of their own fresh cache (and retired cache) is tracked
REUSE_PRIOR = 2.0  # the weight (in observations) an agent's reuse and retired-read estimates give their prior


class ReuseEvidence:
    """How much of its previous request's path an agent's next request (in the same workflow) reads again,
    per part of that path: the context it had read from cache, its fresh prompt tokens, its generated
    tokens. Learned per agent from what happens, in tokens, with all agents' shares as the prior; bounded
    in agents (the least recently observed forgotten)."""

    PARTS: Final = (CONTEXT, FRESH, OUTPUT)

    def __init__(self) -> None:
        # agent -> per part, three counts: [tokens read again, tokens, observations]
        self._counts: OrderedDict[str, list[int]] = OrderedDict()
        self._totals = [0] * 9
        # What share() answers from: the counts as of the last freeze() (the policy's keys must not move
        # between two of its epochs unannounced), and how many observations there were then.
        self._frozen_counts: dict[str, list[int]] = {}
        self._frozen_totals = [0] * 9
        self._observations = self._frozen_observations = 0
        self._shares: dict[tuple[str, int], float] = {}  # share() as of the last freeze, as it was asked

    def observe(self, agent: str, previous: Latest, read: Sequence[Any]) -> None:
        """The agent's new request read the nodes `read` from cache (its path, root's child first, within its
        match): how far along the previous request's path did that go? Where the previous path was evicted
        first, nothing is learned (it might have been read)."""
        if previous.matched is None or previous.prompt is None:
            return
        held = {id(node) for node in read}
        # The deepest node the two paths share within the match: walk up the previous path to it.
        node, below = previous.end, None
        while node is not None and id(node) not in held:
            node, below = getattr(node, "parent", None), node
        shared_tags = tags_of(node) if node is not None else None
        shared = shared_tags.depth if shared_tags is not None else 0
        if shared < previous.depth and below is not None:
            t = tags_of(below)
            if t is None or t.evicted:
                return  # the rest of the previous path was gone before the request came
        self._observations += 1
        counts = agent_counts(self._counts, agent, lambda: [0] * 9)
        # A fixed prompt it computed is not fresh: the demand values it (share() answers 1.0 for it).
        fixed = previous.fixed
        bounds = (fixed, max(fixed, previous.matched), max(fixed, previous.prompt), previous.depth)
        for i, (start, stop) in enumerate(zip(bounds, bounds[1:])):
            if stop <= start:
                continue
            for j, n in enumerate((min(max(shared - start, 0), stop - start), stop - start, 1)):
                counts[3 * i + j] += n
                self._totals[3 * i + j] += n

    def freeze(self) -> None:
        """Answer share() from the evidence seen so far, until the next freeze."""
        self._frozen_counts = {agent: list(counts) for agent, counts in self._counts.items()}
        self._frozen_totals = list(self._totals)
        self._frozen_observations = self._observations
        self._shares = {}

    def doubled(self) -> bool:
        """Whether the observations doubled since the last freeze (early on, evidence is worth freezing often)."""
        return self._observations > 2 * self._frozen_observations

    def share(self, agent: str, part: int) -> float:
        """The share of a node in this part of the agent's latest request its next request reads again
        (1.0 for the fixed prompt: its value comes from every workflow's forecast, not this pair's)."""
        if part not in self.PARTS:
            return 1.0
        key = (agent, part)
        share = self._shares.get(key)  # every key the policy computes asks: answer each once per freeze
        if share is None:
            share = self._shares[key] = self._share(agent, part)
        return share

    def _share(self, agent: str, part: int) -> float:
        i = 3 * (part - CONTEXT)
        read, total, _ = self._frozen_totals[i : i + 3]
        prior = read / total if total else 0.5  # nothing seen yet: either way
        counts = self._frozen_counts.get(agent)
        if counts is None or counts[i + 1] == 0:
            return prior
        read, total, observations = counts[i : i + 3]
        weight = REUSE_PRIOR * total / observations  # the prior counts as REUSE_PRIOR of the agent's observations
        return (read + weight * prior) / (total + weight)


def agent_counts(counts: OrderedDict[str, Any], agent: str, new: Callable[[], Any]) -> Any:
    """`agent`'s entry of per-agent `counts`, made with `new` where missing; the least recently counted agent
    is forgotten past MAX_REUSE_AGENTS."""
    entry = counts.get(agent)
    if entry is None:
        entry = counts[agent] = new()
        if len(counts) > MAX_REUSE_AGENTS:
            counts.popitem(last=False)
    else:
        counts.move_to_end(agent)
    return entry


def read_from_cache(path: Sequence[Any], matched_tokens: int | None) -> Sequence[Any]:
    """The nodes of a request's `path` within the `matched_tokens` it found cached; all of them while it runs
    (None: its match is not final yet)."""
    if matched_tokens is None:
        return path
    depth = 0
    for i, node in enumerate(path):
        t = getattr(node, TAGS_ATTR, None)
        depth = t.depth if t is not None else depth + node_tokens(node)  # a tagged node keeps its depth
        if depth > matched_tokens:
            return path[:i]
    return path
