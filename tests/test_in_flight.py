"""Requests in flight (issue 55, cases 1 and 2): a workflow is not retired by its lease while one of its requests
is queued or running, its lease counts from its last arrival or release, and a request aborted in the queue is
released as a finished one is (no pending entry, no certain read of its agent, no implicit workflow kept)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from plugin_on_sglang import plugin_cache, scheduler_request
from sglang.srt.mem_cache.base_prefix_cache import CacheRequestHandle
from test_pbkv_ingredients import OURS
from test_policies import FixedForecast, Node, eviction_order, touch

from agentcache.engine.adapter import path_nodes
from agentcache.policy import NodeClass, WorkflowRegistry
from agentcache.policy.pbkv import PBKVPolicy
from agentcache.policy.workflows import IN_FLIGHT_LEASES
from agentcache.tags import Stamped, Tags, WorkflowKey

LEASE = 10.0
W = WorkflowKey("", "w")


# ---------------------------------------------------------------- the registry


def test_a_request_in_flight_holds_its_workflow_past_the_lease_which_counts_from_its_release():
    """Before, the lease counted from the request's arrival: one queued or running longer retired its workflow."""
    registry = WorkflowRegistry(lease_s=LEASE)
    registry.observe(W, "a", 0.0)
    assert registry.expire(3 * LEASE) == [] and registry.is_active(W), "its request still runs"
    assert registry.release(W, 3 * LEASE)
    assert not registry.release(W, 3 * LEASE), "nothing more in flight"
    assert registry.expire(4 * LEASE - 1) == [] and registry.is_active(W), "a lease from the release, not the arrival"
    assert [s.id for s in registry.expire(4 * LEASE)] == [W] and registry.expired_count == 1


def test_a_workflow_is_held_while_any_of_its_requests_is_in_flight():
    registry = WorkflowRegistry(lease_s=LEASE)
    registry.observe(W, "a", 0.0)
    registry.observe(W, "b", 1.0)
    registry.release(W, 2.0)
    assert registry.expire(2 * LEASE) == [] and registry.get(W).in_flight == 1
    registry.release(W, 2 * LEASE)
    assert [s.id for s in registry.expire(3 * LEASE)] == [W]


def test_a_lost_release_holds_its_workflow_for_a_bounded_time_only():
    """A release that never comes (a request the scheduler dropped without telling the cache) must not pin its
    workflow: IN_FLIGHT_LEASES leases after its newest arrival, what it still holds is written off."""
    registry = WorkflowRegistry(lease_s=LEASE)
    registry.observe(W, "a", 0.0)
    registry.observe(WorkflowKey("", "other"), "a", 5.0)
    registry.release(WorkflowKey("", "other"), 6.0)
    assert [s.id.id for s in registry.expire(IN_FLIGHT_LEASES * LEASE - 1)] == ["other"] and registry.is_active(W)
    assert [s.id for s in registry.expire(IN_FLIGHT_LEASES * LEASE)] == [W]
    assert registry.lost_releases == 1 and len(registry) == 0


def test_idle_workflows_expire_in_order_of_last_activity_and_cheaply():
    registry = WorkflowRegistry(lease_s=LEASE)
    for i in range(5):
        registry.observe(WorkflowKey("", f"w{i}"), "a", float(i))
    for i in reversed(range(5)):  # released last to first: the lease order is the releases'
        registry.release(WorkflowKey("", f"w{i}"), 10.0 + (4 - i))
    assert [s.id.id for s in registry.expire(10.0 + LEASE + 2)] == ["w4", "w3", "w2"]
    assert [s.id.id for s in registry.recent(5)] == ["w1", "w0"], "recency stays the arrivals'"


# ---------------------------------------------------------------- the policy


def test_a_request_aborted_in_the_queue_leaves_no_certain_read_of_its_agent():
    """pbkv counts a request waiting to be served as a certain read of its agent's fixed prompt. Before, one whose
    client gave up in the queue kept that read for the rest of its workflow's lease."""

    def order(abort: bool) -> list[str]:
        policy = PBKVPolicy(predictor=FixedForecast({}), ingredients=OURS)
        prompt, idle = Node("coder_prompt"), Node("idle")
        touch(policy, [prompt], "w1", "coder", 0, fixed_tokens=10)
        touch(policy, [idle], "w2", "x", 1)
        queued = Tags(workflow="w1", agent="coder", fixed_tokens=10)
        policy.on_request(queued, 2)
        policy.take_changed_keys()  # an eviction round while it waits
        if abort:
            policy.on_release(queued, 3)
            policy.take_changed_keys()
        return eviction_order(policy, [prompt, idle])

    assert order(abort=False) == ["idle", "coder_prompt"], "waiting, its agent's prompt is read for certain"
    assert order(abort=True) == ["coder_prompt", "idle"], "aborted, nobody reads it"


# ---------------------------------------------------------------- the server's cache, on SGLang's real classes

PROMPT = 40


@pytest.fixture
def cache(monkeypatch):
    """The server's cache with a lease of LEASE seconds."""
    from agentcache.server_ext.cache import AgentCache
    from agentcache.server_ext.config import PluginConfig

    monkeypatch.setattr(AgentCache, "config", PluginConfig(lease_s=LEASE))
    return plugin_cache(monkeypatch, 4096)


def request(cache, rid: str, ts: float, workflow: str = "w", implicit: bool = False) -> SimpleNamespace:
    """A request as the scheduler makes it (`finished` set when it is), its tags stamped by the HTTP process."""
    tokens = [hash((rid, i)) % 500 + 10 for i in range(PROMPT)]
    stamped = Stamped("", Tags(workflow=workflow, agent="a", fixed_tokens=16, ts=ts, implicit=implicit))
    req = scheduler_request(rid, tokens, stamped)
    req.done = False
    req.finished = lambda: req.done
    cache.observe(req)
    return req


def finish(cache, req) -> list:
    """What SGLang does when the request finishes: the checkpoint into the tree, then the release. Its path."""
    req.done = True
    cache.checkpoint_into_tree(req, up_to=PROMPT)
    cache.on_release(req, checkpointed=True)
    return path_nodes(cache, req.last_node)


def test_a_request_running_past_the_lease_keeps_its_workflow_active_and_its_path_out_of_the_retired_tier(cache):
    """Before, the clock tick retired the workflow of a request queued and running longer than the lease, and the
    request's path was tagged as retired (evicted first) when it finished."""
    req = request(cache, "r1", 1.0)
    for tick in range(1, 4):  # the HTTP process's clock, every lease/4
        cache.expire(1.0 + tick * LEASE)
    assert cache.policy.registry.is_active(W), "its request still runs"
    path = finish(cache, req)
    assert path and all(cache.policy.classify(node) != NodeClass.RETIRED for node in path)
    assert cache.stats()["in_flight_requests"] == 0
    released = cache.now
    assert cache.expire(released + LEASE - 1) == 0 and cache.policy.registry.is_active(W), "a lease from its finish"
    assert cache.expire(released + LEASE) == 1
    assert all(cache.policy.classify(node) == NodeClass.RETIRED for node in path)


def test_a_retracted_request_still_holds_its_workflow(cache):
    """SGLang releases a retracted request's KV (on_release, unfinished) and queues it again: it is still in flight."""
    req = request(cache, "r1", 1.0)
    cache.on_release(req, checkpointed=False)
    cache.expire(1.0 + 2 * LEASE)
    assert cache.policy.registry.is_active(W) and cache.stats()["in_flight_requests"] == 1
    finish(cache, req)
    assert cache.stats()["in_flight_requests"] == 0


def test_requests_aborted_in_the_queue_are_released(cache):
    """SGLang drops a request abandoned in its queue through `release_aborted_request`, which the plugin did not
    override: the pending entry stayed, a tagged one's agent kept a certain read and an untagged one kept its
    implicit workflow active for the lease."""
    tagged = request(cache, "tagged", 1.0)
    untagged = request(cache, "untagged", 1.0, workflow="implicit-1", implicit=True)
    cache.policy.demand.count_waiting()  # an eviction round while they wait
    assert cache.stats()["active_workflows"] == 2 and cache.policy.demand.pending
    for req in (tagged, untagged):
        cache.release_aborted_request(CacheRequestHandle(req.rid, 0))
    stats = cache.stats()
    assert stats["active_workflows"] == 1, "the untagged request's own workflow ended with it"
    assert not cache.policy.demand.pending and stats["in_flight_requests"] == 0
    assert cache.policy.registry.get(W).in_flight == 0, "the tagged one's lease runs from its abort"
    assert cache.expire(1.0 + LEASE) == 1
