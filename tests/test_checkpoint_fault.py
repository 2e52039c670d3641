"""A fault in the checkpoint into the tree (the split at a fixed prompt, the path's walk, the prefetch
accounting) is taken by the server's cache, as every policy call on the scheduler is (issue 55, case 10)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from plugin_on_sglang import plugin_cache, scheduler_request

from agentcache.policy.nodes import tags_of
from agentcache.tags import Stamped, Tags

PROMPT = 40
FIXED = 16


@pytest.fixture
def cache(monkeypatch):
    return plugin_cache(monkeypatch, 4096)


def request(cache, rid: str, tokens: list[int]) -> SimpleNamespace:
    """A request as the scheduler makes it, its tags stamped by the HTTP process."""
    stamped = Stamped("", Tags(workflow="w", agent="a", fixed_tokens=FIXED, ts=1.0))
    req = scheduler_request(rid, tokens, stamped)
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
