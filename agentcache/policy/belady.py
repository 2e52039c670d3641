"""Belady's MIN, the offline optimum: evict the node whose next use is farthest in the future.

It sees the whole trace through `next_use(node)`, the index of the next
request that will read the node (infinity if none will), which the replay
computes from the trace. Nothing online can do better than this order in
the unit-size case; with variable-size radix nodes it is the standard
near-optimal reference every online policy is measured against.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agentcache.policy.base import CacheNode, CachePolicy
from agentcache.policy.workflows import WorkflowRegistry


class BeladyPolicy(CachePolicy):
    name = "belady"

    def __init__(self, next_use: Callable[[Any], float], registry: WorkflowRegistry | None = None):
        super().__init__(registry)
        self.next_use = next_use

    def priority(self, node: CacheNode) -> tuple:
        return (-self.next_use(node), node.last_access_time)
