"""The offline reference (Belady's MIN rule): evict the node whose next use is farthest in the future.

It sees the whole trace through `next_use(node)`, the index of the next
request that will read the node (infinity if none will), which the replay
computes from the trace. For unit-size items this order is optimal; over
radix nodes of different sizes, freed whole leaves at a time, it is a strong
heuristic and not a proven optimum: an online policy can beat it. Every
online policy is measured against it, and the ladder reports the unlimited
cache beside it as the true ceiling.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agentcache.policy.base import CachePolicy
from agentcache.policy.nodes import CacheNode
from agentcache.policy.workflows import WorkflowRegistry


class BeladyPolicy(CachePolicy):
    name = "belady"

    def __init__(self, next_use: Callable[[Any], float], registry: WorkflowRegistry | None = None):
        super().__init__(registry)
        self.next_use = next_use

    def priority(self, node: CacheNode) -> tuple:
        return (-self.next_use(node), node.last_access_time)
