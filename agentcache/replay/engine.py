"""One SGLang radix cache of a fixed capacity, fed requests the way SGLang's scheduler feeds it.

Per request, as the server does (see SGLang 0.5.23 ``scheduler`` / ``UnifiedRadixCache``):

1. match the prompt, at most prompt-1 tokens (the last one is always computed);
2. lock the matched node, allocate slots for prompt + output - 1 tokens, evicting
   whole leaves through the cache (``evict_for_alloc``) when short;
3. insert prompt + output - 1 into the tree, then re-insert the prompt and the
   fixed prompt so node boundaries fall at both;
4. unlock; tag the path for the policy.

The cache is SGLang's real ``UnifiedRadixCache`` on its Python tree core, over
CPU KV pools of exactly `capacity` token slots.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass
from typing import NamedTuple

import torch
from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams, MatchPrefixParams
from sglang.srt.mem_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
from sglang.srt.mem_cache.radix_cache import RadixKey
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

from agentcache.policy import CachePolicy, RequestTags
from agentcache.replay.tokens import EncodedRequest
from agentcache.server_ext.adapter import FULL, TaggedFullComponent, install_policy, path_nodes, split_at

# SGLang's built-in eviction strategies (--radix-eviction-policy), replayed beside ours.
BUILTIN_STRATEGIES = ("lfu", "slru", "tlru", "priority", "fifo", "mru", "filo", "lru")


class ServeResult(NamedTuple):
    hit_tokens: int  # prompt tokens served from device cache
    admitted: bool  # False when even an empty cache could not hold the request


@dataclass
class CacheStats:
    evict_calls: int = 0
    evicted_tokens: int = 0
    oversized: int = 0


def build_cache(capacity: int, builtin: str | None = None) -> UnifiedRadixCache:
    """A UnifiedRadixCache over CPU pools of exactly `capacity` slots (page size 1).

    `builtin` picks one of SGLang's own strategies; otherwise the caller
    installs an agentcache policy.
    """
    # The smallest KV pool SGLang accepts: the replay needs slots, not tensors.
    kv_pool = MHATokenToKVPool(
        size=capacity,
        page_size=1,
        dtype=torch.float16,
        head_num=1,
        head_dim=1,
        layer_num=1,
        device="cpu",
        enable_memory_saver=False,
    )
    allocator = TokenToKVPoolAllocator(
        size=capacity, dtype=torch.float16, device="cpu", kvcache=kv_pool, need_sort=False
    )
    # Only the scheduler's checkpoint path reads req_to_token; the replay inserts directly.
    req_to_token = ReqToTokenPool(size=1, max_context_len=1, device="cpu", enable_memory_saver=False)
    params = CacheInitParams(
        disable=False,
        req_to_token_pool=req_to_token,
        token_to_kv_pool_allocator=allocator,
        page_size=1,
        eviction_policy=builtin or "lru",
        eviction_policy_config=None,
        tree_components=(FULL,),
        component_registry_override={FULL: TaggedFullComponent},
        tree_core_backend="python",
    )
    # With `builtin`, the tree core builds the strategy from SGLang's own table (and turns on
    # the per-node bookkeeping tlru needs), exactly as --radix-eviction-policy does.
    return UnifiedRadixCache(params)


class ReplayCache:
    """A capacity-bounded SGLang cache plus the policy that orders its evictions."""

    def __init__(self, capacity: int, policy: CachePolicy, builtin: str | None = None):
        if capacity < 2:
            raise ValueError(f"capacity must be >= 2 tokens, got {capacity}")
        self.capacity = capacity
        self.policy = policy
        self.cache = build_cache(capacity, builtin)
        # With a built-in strategy the policy only keeps tags (for per-class statistics).
        install_policy(self.cache, policy, order_eviction=builtin is None)
        self.allocator = self.cache.token_to_kv_pool_allocator
        self.component: TaggedFullComponent = self.cache.components[FULL]
        self.stats = CacheStats()

    def serve(self, enc: EncodedRequest, tags: RequestTags, now: float) -> ServeResult:
        cache = self.cache
        tokens = array("q", enc.tokens)
        prompt_len = enc.prompt_len
        kv_len = len(tokens) - 1  # the last generated token is never fed back, so it has no KV
        match = cache.match_prefix(MatchPrefixParams(key=RadixKey(tokens[:prompt_len], limit=prompt_len - 1)))
        hit = match.device_prefix_len
        lock = cache.lock(match.last_device_node)
        try:
            need = kv_len - hit
            if need > self.allocator.available_size() + cache.evictable_size():
                # The scheduler would never admit it (its budget is free + evictable).
                self.stats.oversized += 1
                return ServeResult(0, admitted=False)
            shortfall = need - self.allocator.available_size()
            if shortfall > 0:
                result = cache.evict_for_alloc(EvictParams(num_tokens=shortfall))
                self.stats.evict_calls += 1
                self.stats.evicted_tokens += result.num_tokens_evicted
            fresh = self.allocator.alloc(need)
            if fresh is None:
                raise RuntimeError(
                    f"allocation of {need} slots failed after eviction; the cache's accounting is broken"
                )
            prefix = cache.path_device_indices(match.last_device_node)[:hit]
            values = torch.cat([prefix.to(torch.int64), fresh.to(torch.int64)])
            key = RadixKey(tokens[:kv_len])
            inserted = cache.insert(InsertParams(key=key, value=values, prev_prefix_len=hit, inserted_len=0))
            split_at(cache, key, values, prompt_len, priority=1)
            split_at(cache, key, values, enc.fixed_len)
            self.policy.tag_path(path_nodes(cache, inserted.last_device_node), tags, now, hit)
        finally:
            cache.unlock(lock)
        return ServeResult(hit, admitted=True)

    def held_tokens(self) -> int:
        return self.capacity - self.allocator.available_size()
