"""The server's cache (server_ext.cache.AgentCache) on SGLang's real classes, without a scheduler: what the tests
of the plugin's scheduler side share. SGLang's checkpoint into the tree stands in as the insert it does (the
matched prefix's slots reused, the rest allocated), and a request is the object the scheduler hands the cache."""

from __future__ import annotations

from types import SimpleNamespace

import torch
from sglang.srt.mem_cache.base_prefix_cache import InsertParams, MatchPrefixParams
from sglang.srt.mem_cache.radix_cache import RadixKey
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

from agentcache.tags import Stamped


def sglang_checkpoint(self, req, *, up_to, **kwargs):  # noqa: ANN001, ANN202, ARG001
    key = RadixKey(req.full_untruncated_fill_ids[:up_to])
    match = self.match_prefix(MatchPrefixParams(key=key))
    fresh = self.token_to_kv_pool_allocator.alloc(len(key) - match.device_prefix_len).to(torch.int64)
    prefix = self.path_device_indices(match.last_device_node)[: match.device_prefix_len].to(torch.int64)
    self.insert(InsertParams(key=key, value=torch.cat([prefix, fresh]), prev_prefix_len=match.device_prefix_len))
    req.last_node = self.match_prefix(MatchPrefixParams(key=key)).last_device_node


def plugin_cache(monkeypatch, capacity: int):  # noqa: ANN001, ANN201
    """AgentCache over SGLang's UnifiedRadixCache with `capacity` token slots on the CPU."""
    from agentcache.replay.cpu_cache import build_cache
    from agentcache.server_ext.cache import AgentCache

    monkeypatch.setattr(UnifiedRadixCache, "checkpoint_into_tree", sglang_checkpoint)
    return build_cache(capacity, cache_class=AgentCache)


def scheduler_request(rid: str, tokens: list[int], stamped: Stamped) -> SimpleNamespace:
    """A request as the scheduler makes it, its tags stamped by the HTTP process; finished unless told otherwise
    (set `finished` to change that)."""
    return SimpleNamespace(
        rid=rid,
        origin_input_ids=tokens,
        full_untruncated_fill_ids=tokens,
        extra_key=None,
        cache_salt=None,
        priority=0,
        cached_tokens=0,
        last_node=None,
        sampling_params=SimpleNamespace(custom_params={"agentcache": stamped.to_wire()}),
        finished=lambda: True,
    )
