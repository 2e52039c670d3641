"""sglang-router 0.3.2's ``cache_aware`` policy in the scale-out replay: its approximate prefix tree of what
it sent where, and its choice between that tree and the in-flight load."""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field

from agentcache.replay.routers import ModelledRouter
from agentcache.replay.tokens import EncodedRequest
from agentcache.trace import Request

# sglang-router 0.3.2's defaults (sglang_router/router_args.py).
CACHE_THRESHOLD = 0.3
BALANCE_ABS_THRESHOLD = 64
BALANCE_REL_THRESHOLD = 1.5
EVICTION_INTERVAL_S = 60.0
MAX_TREE_CHARS = 2**26
CHARS_PER_TOKEN = 4  # the router's tree counts characters; the trace counts tokens


@dataclass
class _TreeNode:
    parent: int  # the chain before this one; 0 at the root
    tokens: int
    tenants: dict[int, float] = field(default_factory=dict)  # worker -> last access (insertion order kept)
    children: dict[int, int] = field(default_factory=dict)  # worker -> children holding it


class ApproximateTree:
    """sglang-router's approximate radix tree: what the router sent to which worker (its tenants).

    The router's tree is over the request's characters; here nodes are the
    prompt's segments in context (the codec's chains), which is the same tree
    where prompts differ only at segment boundaries. Sizes are tokens per tenant.
    """

    def __init__(self, workers: int, max_tokens: int = MAX_TREE_CHARS // CHARS_PER_TOKEN):
        self.max_tokens = max_tokens
        self.nodes: dict[int, _TreeNode] = {}
        self.size = [0] * workers

    def match(self, chains: Sequence[int], lengths: Sequence[int], now: float) -> tuple[int, int | None]:
        """Tokens of the longest prefix in the tree and a worker holding it (the earliest still there)."""
        matched, last = 0, None
        for chain, length in zip(chains, lengths):
            node = self.nodes.get(chain)
            if node is None or not node.tenants:
                break
            matched, last = matched + length, node
        if last is None:
            return 0, None
        tenant = next(iter(last.tenants))
        last.tenants[tenant] = now
        return matched, tenant

    def insert(self, chains: Sequence[int], lengths: Sequence[int], tenant: int, now: float) -> None:
        parent = 0
        for chain, length in zip(chains, lengths):
            node = self.nodes.get(chain)
            if node is None:
                node = self.nodes[chain] = _TreeNode(parent, length)
            if tenant not in node.tenants:
                self.size[tenant] += length
                if parent:
                    above = self.nodes[parent].children
                    above[tenant] = above.get(tenant, 0) + 1
            node.tenants[tenant] = now
            parent = chain

    def smallest_tenant(self) -> int:
        return min(range(len(self.size)), key=self.size.__getitem__)

    def evict(self) -> None:
        """Each worker over `max_tokens` loses its least recently used leaves until it fits (the router's timer)."""
        over = {t for t, size in enumerate(self.size) if size > self.max_tokens}
        if not over:
            return
        leaves = [
            (node.tenants[t], chain, t)
            for chain, node in self.nodes.items()
            for t in over
            if t in node.tenants and not node.children.get(t)
        ]
        heapq.heapify(leaves)
        while leaves:
            _, chain, tenant = heapq.heappop(leaves)
            if self.size[tenant] <= self.max_tokens:
                continue
            node = self.nodes[chain]
            del node.tenants[tenant]
            self.size[tenant] -= node.tokens
            if not node.tenants and not node.children:
                del self.nodes[chain]
            if node.parent:
                parent = self.nodes[node.parent]
                parent.children[tenant] -= 1
                if not parent.children[tenant]:
                    del parent.children[tenant]
                    heapq.heappush(leaves, (parent.tenants[tenant], node.parent, tenant))


class CacheAware(ModelledRouter):
    """sglang-router 0.3.2's ``cache_aware`` policy, with its defaults."""

    def __init__(
        self,
        workers: int,
        *,
        cache_threshold: float = CACHE_THRESHOLD,
        balance_abs_threshold: int = BALANCE_ABS_THRESHOLD,
        balance_rel_threshold: float = BALANCE_REL_THRESHOLD,
        eviction_interval_s: float = EVICTION_INTERVAL_S,
        max_tree_tokens: int = MAX_TREE_CHARS // CHARS_PER_TOKEN,
    ):
        super().__init__(workers)
        self.tree = ApproximateTree(workers, max_tree_tokens)
        self.cache_threshold = cache_threshold
        self.balance_abs_threshold = balance_abs_threshold
        self.balance_rel_threshold = balance_rel_threshold
        self.eviction_interval_s = eviction_interval_s
        self._next_eviction = eviction_interval_s

    def imbalanced(self) -> bool:
        low, high = min(self.in_flight.load), max(self.in_flight.load)
        return high - low > self.balance_abs_threshold and high > low * self.balance_rel_threshold

    def choose(self, request: Request, enc: EncodedRequest, now: float) -> int:
        while now >= self._next_eviction:
            self.tree.evict()
            self._next_eviction += self.eviction_interval_s
        lengths = [s.tokens for s in request.segments]
        if self.imbalanced():
            choice = self.in_flight.least_loaded()
        else:
            matched, tenant = self.tree.match(enc.prompt_chains, lengths, now)
            rate = matched / enc.prompt_len if enc.prompt_len else 0.0
            choice = tenant if tenant is not None and rate > self.cache_threshold else self.tree.smallest_tenant()
        self.tree.insert(enc.prompt_chains, lengths, choice, now)
        return choice
