"""Lifecycle-aware eviction (PBKV-LAE): cache used only by ended workflows goes first, then LRU.

An ended workflow will never send another request, so a node that only ended
workflows touched has no known future use: a fact, which outranks any
estimate. Within each tier the order is SGLang's LRU.
"""

from agentcache.policy.base import CachePolicy
from agentcache.policy.nodes import CacheNode, tags_of


class LifecyclePolicy(CachePolicy):
    name = "lifecycle"

    def priority(self, node: CacheNode) -> tuple:
        retired = self.is_retired(tags_of(node))
        return (0 if retired else 1, node.last_access_time)
