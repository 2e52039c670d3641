"""The eviction heap a policy that keeps its keys evicts by, kept across SGLang's eviction rounds.

Plain Python with no SGLang import (the tree is duck-typed), so that it compiles with the policy core
(agentcache.compiled): it runs at every eviction round on the scheduler's thread.
"""

from __future__ import annotations

import heapq
from itertools import chain, count
from typing import Any

from mypy_extensions import mypyc_attr

from agentcache.policy import CachePolicy


# A set subclass SGLang's tree holds: an ordinary Python class, compiled or not.
@mypyc_attr(native_class=False)
class RecordedLeaves(set):
    """SGLang's set of evictable device leaves (``UnifiedTreeCore.evictable_device_leaves``, which SGLang changes
    only by ``add`` and ``discard``), also listing the leaves added since the eviction heap last looked: the
    heap finds the leaves it has no entry for there, not by a pass over every leaf at every eviction round."""

    __slots__ = ("added",)

    def __init__(self, leaves: Any = ()):
        super().__init__(leaves)
        self.added: list[Any] = []

    def add(self, node: Any) -> None:
        if node not in self:
            set.add(self, node)
            self.added.append(node)


class EvictionHeap:
    """The evictable leaves in the policy's order, kept across eviction rounds.

    SGLang's FULL component rebuilds its heap from every evictable leaf at every eviction round, asking the
    strategy for each leaf's key: hundreds of calls per request at the cache sizes a GPU serves. For a policy
    that keeps its keys (``CachePolicy.keeps_keys``) this heap re-keys only the nodes the policy says changed
    and the leaves it has no entry for; everything else is checked when it reaches the top: an entry whose
    node is no longer an evictable leaf is dropped, and one whose key moved is pushed again with its current
    key. A node read by a request is re-keyed when the request tags it, so eviction order is the same as a
    rebuild's; one read by a match alone (the live scheduler probing a waiting request) is re-keyed when it
    reaches the top.
    """

    def __init__(self, policy: CachePolicy):
        self.policy = policy
        # The policy's method looked up once, as SGLang's strategy holds it (PolicyStrategy): every key the heap
        # asks goes through this one callable, compiled or not.
        self.priority = policy.priority
        self._entries: list[tuple[tuple, int, Any]] = []  # (key, sequence number, node), the smallest key first
        self._live: dict[Any, int] = {}  # node -> the sequence number of its current entry
        self._sequence = count()
        self._root: Any = None
        self._taken: list[Any] = []  # the leaves popped since the last sync (for SGLang to evict)

    def sync(self, tree: Any) -> None:
        """Bring the heap up to date with `tree`'s evictable leaves before an eviction round."""
        leaves = tree.evictable_device_leaves
        changed = self.policy.take_changed_keys()
        if type(leaves) is not RecordedLeaves:  # the first round, or SGLang made a new set: what it added is unknown
            leaves = tree.evictable_device_leaves = RecordedLeaves(leaves)
            changed = None
        # A rebuild when every key may have moved, after a cache reset, or once dropped entries dominate.
        if changed is None or tree.root_node is not self._root or len(self._live) > 2 * len(leaves) + 64:
            leaves.added.clear()
            self._taken = []
            self._root = tree.root_node
            priority, sequence = self.priority, self._sequence
            self._entries = [(priority(node), next(sequence), node) for node in leaves]
            self._live = {node: s for _, s, node in self._entries}
            heapq.heapify(self._entries)
            return
        live = self._live
        for t in changed:
            try:
                node = tree.node_by_id(t.node_id)
            except KeyError:  # the tree dropped the node
                continue
            if live.pop(node, None) is not None and node in leaves:  # its entry is dead: re-key it
                self.push(node)
        # New leaves (an old entry of one is still checked when it reaches the top), and any leaf the last round
        # took that SGLang did not evict after all.
        added, leaves.added, taken, self._taken = leaves.added, [], self._taken, []
        for node in chain(added, taken):
            if node not in live and node in leaves:
                self.push(node)
        if len(self._entries) > 2 * len(live) + 64:
            self._entries = [e for e in self._entries if self._live.get(e[2]) == e[1]]
            heapq.heapify(self._entries)

    def push(self, node: Any) -> None:
        sequence = next(self._sequence)
        self._live[node] = sequence
        heapq.heappush(self._entries, (self.priority(node), sequence, node))

    def pop(self, leaves: set) -> Any:
        """The evictable leaf with the smallest current key (removed from the heap), or None."""
        entries, live, priority = self._entries, self._live, self.priority
        while entries:
            key, sequence, node = heapq.heappop(entries)
            if live.get(node) != sequence:
                continue
            if node not in leaves:
                del live[node]
                continue
            current = priority(node)
            if current is not key and current != key:
                self.push(node)
                continue
            del live[node]
            self._taken.append(node)
            return node
        return None
