"""/flush_cache on the plugin's server: the tree emptied, and the policy started over as on a fresh server, so that
a run after a flush (the demo's next repetition) neither reads nodes that are gone nor learns from the runs before."""

from __future__ import annotations

from plugin_on_sglang import plugin_cache, scheduler_request

from agentcache.engine.adapter import cached_nodes
from agentcache.server_ext.views import workflow_view
from agentcache.tags import Stamped, Tags, WorkflowKey


def serve(cache, rid: str, tokens: list[int], workflow: str, agent: str) -> None:
    req = scheduler_request(rid, tokens, Stamped("", Tags(workflow=workflow, agent=agent, fixed_tokens=16, ts=1.0)))
    cache.observe(req)
    cache.checkpoint_into_tree(req, up_to=len(tokens))
    cache.on_release(req, checkpointed=True)


def test_a_flush_starts_the_policy_over_as_on_a_fresh_server(monkeypatch):
    cache = plugin_cache(monkeypatch, 4096)
    system = list(range(1000, 1016))
    serve(cache, "r1", system + list(range(2000, 2040)), "w", "planner")
    serve(cache, "r2", system + list(range(2000, 2060)), "w", "coder")
    before = cache.policy
    assert WorkflowKey("", "w") in before.registry.by_id and workflow_view(cache, WorkflowKey("", "w"))["requests"] == 2

    cache.reset()  # what SGLang's /flush_cache calls, once no request is in flight

    assert list(cached_nodes(cache)) == []
    assert cache.policy is not before and cache.component.policy is cache.policy, "the new policy orders eviction"
    assert not cache.policy.registry.by_id, "no workflow known"
    assert workflow_view(cache, WorkflowKey("", "w"))["requests"] == 0, "the control routes forget it too"
    serve(cache, "r3", system + list(range(2000, 2040)), "w", "planner")
    assert cache.policy.registry.by_id and not cache.policy_faults, "the next run is served by the new policy"
