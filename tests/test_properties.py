"""Property tests: random request/end sequences through SGLang's real cache keep every invariant, for every policy."""

from __future__ import annotations

import string

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentcache import wire
from agentcache.cost import DEFAULT_COST
from agentcache.policy import ONLINE_POLICIES, NodeClass, RequestTags, WorkflowRegistry, make_policy, prefetch, tags_of
from agentcache.replay.engine import ReplayCache
from agentcache.replay.runner import prefetch_step, split_prefetch
from agentcache.replay.tokens import TokenCodec
from agentcache.trace import End, Request, Segment

SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# A small world so that sequences share prefixes: 3 agents' fixed prompts, a few history segments.
fixed = st.sampled_from([("sys/a", 40), ("sys/b", 25), ("sys/c", 60)])
history = st.lists(st.sampled_from([("t/1", 15), ("t/2", 30), ("o/1", 5), ("o/2", 12), ("x/3", 50)]), max_size=4)
request = st.tuples(st.sampled_from(["w1", "w2", "w3", "w4"]), fixed, history, st.integers(1, 20))
operation = st.one_of(request, st.tuples(st.just("end"), st.sampled_from(["w1", "w2", "w3", "w4"])))


def events_of(ops) -> list:
    events, ts = [], 0.0
    for op in ops:
        ts += 1.0
        if op[0] == "end":
            events.append(End(ts, op[1]))
        else:
            workflow, sys_seg, hist, output = op
            agent = sys_seg[0].split("/")[1]
            segments = (Segment(*sys_seg), *(Segment(*h) for h in hist))
            events.append(Request(ts, workflow, agent, segments, 1, output))
    return events


def depth_of(node) -> int:
    depth = 0
    while node.parent is not None:
        depth += len(node.key)
        node = node.parent
    return depth


def check(cache: ReplayCache) -> None:
    c = cache.cache
    tree_tokens, _ = c.total_size()
    assert cache.allocator.available_size() + tree_tokens == cache.capacity
    assert c.protected_size() == 0
    c.sanity_check()
    stack = list(c.tree_core.root_node.children.values())
    while stack:
        node = stack.pop()
        stack.extend(node.children.values())
        t = tags_of(node)
        if t is not None:
            assert t.depth == depth_of(node), "tags keep the node's depth across splits"
            assert cache.policy.classify(node) in NodeClass.ALL
        priority = cache.policy.priority(node)
        assert isinstance(priority, tuple) and priority == priority  # no NaN


@pytest.mark.parametrize("name", [*ONLINE_POLICIES, "pbkv+prefetch", "pbkv+warmup"])
@SETTINGS
@given(ops=st.lists(operation, min_size=1, max_size=30), capacity=st.integers(80, 400))
def test_random_sequences_keep_the_cache_consistent(name, ops, capacity):
    graph = {"a": ["b", "c"], "b": ["c"], "c": ["a"]}
    base, mode = split_prefetch(name)
    policy = make_policy(base, registry=WorkflowRegistry(lease_s=10), call_graph=graph)
    cache = ReplayCache(capacity, policy, host_capacity=2 * capacity if mode == prefetch.CONSERVATIVE else 0)
    codec = TokenCodec()
    for i, event in enumerate(events_of(ops)):
        if isinstance(event, End):
            policy.on_end(event.workflow, event.ts)
            continue
        if mode is not None:
            prefetch_step(cache, policy, mode, 1.0, event.ts, DEFAULT_COST)
            check(cache)
        enc = codec.encode(event, i)
        tags = RequestTags(event.workflow, event.agent, enc.fixed_len)
        policy.on_request(tags, event.ts)
        result = cache.serve(enc, tags, event.ts)
        assert 0 <= result.hit_tokens <= max(0, enc.prompt_len - 1)
        assert result.admitted == (len(enc.tokens) - 1 <= capacity)
        check(cache)


@SETTINGS
@given(ops=st.lists(operation, min_size=5, max_size=30))
def test_an_ended_workflows_private_nodes_are_retired_and_go_first(ops):
    policy = make_policy("pbkv", registry=WorkflowRegistry(lease_s=1e9))
    cache = ReplayCache(10_000, policy)
    codec = TokenCodec()
    for i, event in enumerate(events_of(ops)):
        if isinstance(event, End):
            policy.on_end(event.workflow, event.ts)
            continue
        enc = codec.encode(event, i)
        tags = RequestTags(event.workflow, event.agent, enc.fixed_len)
        policy.on_request(tags, event.ts)
        cache.serve(enc, tags, event.ts)
    stack = list(cache.cache.tree_core.root_node.children.values())
    retired, others = [], []
    while stack:
        node = stack.pop()
        stack.extend(node.children.values())
        t = tags_of(node)
        if t is None:
            continue
        if not t.fixed_agents and not any(policy.registry.is_active(w) for w in t.workflows):
            retired.append(node)
        else:
            others.append(node)
    if retired and others:
        assert max(policy.priority(n) for n in retired) < min(policy.priority(n) for n in others)


printable = st.text(alphabet=string.printable + "äö€\x00\x7f", max_size=300)
scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**40), 2**40), st.floats(allow_nan=True), printable)
tag_objects = st.one_of(
    scalars,
    st.lists(scalars, max_size=3),
    st.dictionaries(
        st.sampled_from(["v", "workflow", "agent", "agent_name", "fixed_messages", "fixed_tokens", "fixed_chars", "x"]),
        st.one_of(scalars, st.lists(scalars, max_size=2), st.dictionaries(printable, scalars, max_size=2)),
    ),
)


@settings(max_examples=500, deadline=None)
@given(tag_objects)
def test_the_tag_parser_accepts_or_refuses_with_a_reason_never_anything_else(obj):
    try:
        tags = wire.parse(obj)
    except wire.TagError as exc:
        assert exc.reason and str(exc)
        return
    assert (
        isinstance(tags.workflow, str) and 0 < len(tags.workflow) <= wire.MAX_ID_CHARS and tags.workflow.isprintable()
    )
    assert wire.parse(tags.to_wire()) == tags
