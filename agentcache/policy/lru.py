"""LRU: what SGLang does by default (``evict_policy.LRUStrategy``): least recently used first."""

from agentcache.policy.base import CachePolicy
from agentcache.policy.nodes import CacheNode


class LRUPolicy(CachePolicy):
    name = "lru"

    def priority(self, node: CacheNode) -> tuple:
        return (node.last_access_time,)
