"""A fault in the checkpoint into the tree (the split at a fixed prompt, the path's walk, the prefetch
accounting) is taken by the server's cache, as every policy call on the scheduler is (issue 55, case 10)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from sglang.srt.mem_cache.base_prefix_cache import InsertParams, MatchPrefixParams
from sglang.srt.mem_cache.radix_cache import RadixKey
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

from agentcache.policy.base import tags_of
from agentcache.tags import Stamped, Tags

PROMPT = 40
FIXED = 16


@pytest.fixture
def cache(monkeypatch):
    """The server's cache on SGLang's real classes; SGLang's own checkpoint stands in as the insert it does."""
    from agentcache.replay.cpu_cache import build_cache
    from agentcache.server_ext.cache import AgentCache

    def sglang_checkpoint(self, req, *, up_to, **kwargs):  # noqa: ANN001, ANN202
        key = RadixKey(req.full_untruncated_fill_ids[:up_to])
        values = self.token_to_kv_pool_allocator.alloc(len(key)).to(torch.int64)
        self.insert(InsertParams(key=key, value=values))
        req.last_node = self.match_prefix(MatchPrefixParams(key=key)).last_device_node

    monkeypatch.setattr(UnifiedRadixCache, "checkpoint_into_tree", sglang_checkpoint)
    return build_cache(4096, cache_class=AgentCache)


def request(cache, rid: str, tokens: list[int]) -> SimpleNamespace:
    """A request as the scheduler makes it, its tags stamped by the HTTP process."""
    stamped = Stamped("", Tags(workflow="w", agent="a", fixed_tokens=FIXED, ts=1.0))
    req = SimpleNamespace(
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
    cache.observe(req)
    return req


def test_a_fault_in_the_checkpoint_into_the_tree_is_counted_and_the_request_served(cache, monkeypatch):
    """Before, `split_and_tag` (the split at the fixed prompt, the path's walk) and `take_prefetched` ran outside
    the policy's guard: an exception there went up through SGLang's scheduler and took the worker down. Now it is
    counted in `policy_faults`, the policy kept, and the next request's path split and tagged as usual."""
    import agentcache.engine.fixed_prompt as fixed_prompt

    walk, calls = fixed_prompt.path_nodes, []

    def broken(*args):  # noqa: ANN002, ANN202
        calls.append(args)
        if len(calls) == 1:
            raise KeyError("a bug in the path's walk")
        return walk(*args)

    monkeypatch.setattr(fixed_prompt, "path_nodes", broken)
    first = request(cache, "r1", list(range(PROMPT)))
    cache.checkpoint_into_tree(first, up_to=PROMPT)  # raised before
    cache.on_release(first, checkpointed=True)
    assert cache.stats()["policy_faults"] == {"a checkpoint into the tree": 1}
    assert cache.component.policy is not None, "a bookkeeping fault keeps the policy"

    second = request(cache, "r2", list(range(PROMPT // 2)) + [999] * (PROMPT // 2))
    cache.checkpoint_into_tree(second, up_to=PROMPT)
    path = fixed_prompt.path_nodes(cache, second.last_node)
    assert [len(node.key) for node in path][0] == FIXED, "split at the fixed prompt"
    assert all(tags_of(node) is not None for node in path), "tagged"
    assert cache.stats()["policy_faults"] == {"a checkpoint into the tree": 1}
