"""Property tests: random request/end sequences through SGLang's real cache keep every invariant, for every policy."""

from __future__ import annotations

import math
import string

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from agentcache import tags as wire
from agentcache.cost import DEFAULT_COST
from agentcache.policy import OURS, NodeClass, PolicySpec, WorkflowRegistry, make_policy, prefetch, tags_of
from agentcache.replay.engine import ReplayCache
from agentcache.replay.runner import prefetch_step
from agentcache.replay.tokens import TokenCodec
from agentcache.tags import Tags, WorkflowKey
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


def nans_in(priority: object) -> list[object]:
    """The NaNs among a priority's floats, nested tuples included. (``priority == priority`` cannot find one:
    tuple equality compares items by identity first, and a NaN is itself.)"""
    if isinstance(priority, tuple):
        return [nan for item in priority for nan in nans_in(item)]
    return [priority] if isinstance(priority, float) and math.isnan(priority) else []


def test_the_nan_check_finds_a_nan_anywhere_in_a_priority():
    assert nans_in((1, float("nan"))) and nans_in((0, (2.0, math.nan), 3))
    assert not nans_in((1, 0.5, math.inf, 7)) and not nans_in(())


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
        assert isinstance(priority, tuple) and not nans_in(priority), priority


@pytest.mark.parametrize("name", [*(p for p in OURS if p != "belady"), "pbkv+prefetch", "pbkv+warmup"])
@SETTINGS
@given(ops=st.lists(operation, min_size=1, max_size=30), capacity=st.integers(80, 400))
def test_random_sequences_keep_the_cache_consistent(name, ops, capacity):
    graph = {"a": ["b", "c"], "b": ["c"], "c": ["a"]}
    spec = PolicySpec.parse(name)
    mode = spec.prefetch
    policy = make_policy(spec, registry=WorkflowRegistry(lease_s=10), call_graph=graph)
    cache = ReplayCache(capacity, policy, host_capacity=2 * capacity if mode == prefetch.CONSERVATIVE else 0)
    codec = TokenCodec()
    for i, event in enumerate(events_of(ops)):
        if isinstance(event, End):
            policy.on_end(WorkflowKey("", event.workflow), event.ts)
            continue
        if mode is not None:
            prefetch_step(cache, policy, mode, 1.0, event.ts, DEFAULT_COST)
            check(cache)
        enc = codec.encode(event, i)
        tags = Tags(workflow=event.workflow, agent=event.agent, fixed_tokens=enc.fixed_len)
        policy.on_request(tags, event.ts)
        result = cache.serve(enc, tags, event.ts)
        assert 0 <= result.hit_tokens <= max(0, enc.prompt_len - 1)
        assert result.admitted == (len(enc.tokens) - 1 <= capacity)
        check(cache)


# Found by hypothesis: a workflow id used again after its end reads the retired cache of the one before.
REUSED_AFTER_END = [("w1", ("sys/a", 40), [], 1)] * 13 + [
    ("w1", ("sys/a", 40), [("t/1", 15), ("t/1", 15)], 1),
    ("end", "w1"),
    ("w1", ("sys/a", 40), [], 1),
    ("end", "w1"),
    ("end", "w1"),
    ("w2", ("sys/a", 40), [("t/1", 15)], 1),
    ("w2", ("sys/a", 40), [], 1),
]


@SETTINGS
@given(ops=st.lists(operation, min_size=5, max_size=30))
@example(ops=REUSED_AFTER_END)
def test_an_ended_workflows_private_nodes_are_retired_and_go_first(ops):
    policy = make_policy("pbkv", registry=WorkflowRegistry(lease_s=1e9))
    cache = ReplayCache(10_000, policy)
    codec = TokenCodec()
    for i, event in enumerate(events_of(ops)):
        if isinstance(event, End):
            policy.on_end(WorkflowKey("", event.workflow), event.ts)
            continue
        enc = codec.encode(event, i)
        tags = Tags(workflow=event.workflow, agent=event.agent, fixed_tokens=enc.fixed_len)
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
        elif policy.priority(node)[0] == 0:
            # In the retired tier though a workflow is active: only where retired cache is read again (a workflow
            # id used again after its end reads the cache of the one before) and the node's own workflows value
            # it below that rate (retired_evidence). A fixed prompt never is.
            assert not t.fixed_agents and policy.retired_reads.share_of(t) > 0.0
        else:
            others.append(node)
    assert all(policy.priority(n)[0] == 0 for n in retired)
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


# ---------------------------------------------------------------- tag intake in the HTTP process

INTAKE_REASONS = {
    "not_an_object",
    "bad_version",
    "nested",
    "bad_workflow",
    "bad_agent",
    "bad_agent_name",
    "bad_fixed_messages",
    "bad_fixed_tokens",
    "bad_fixed_chars",
    "bad_header",
}


def nested(depth: int, leaf: str = "1") -> str:
    return "[" * depth + leaf + "]" * depth


json_ish = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=20)),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)),
    max_leaves=12,
)
headers = st.one_of(
    st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=255), max_size=300),  # any latin-1 header text
    st.builds(nested, st.integers(0, 5000)),
    st.builds(lambda n: '{"a":' * n + "1" + "}" * n, st.integers(0, 5000)),
    st.builds(lambda obj: __import__("json").dumps(obj), json_ish),
    st.builds(lambda n: '"' + "x" * n + '"', st.integers(0, 100_000)),
)


def starlette_request(header: str | None, authorization: str = "") -> object:
    from starlette.requests import Request as StarletteRequest

    raw = [(b"authorization", authorization.encode("latin-1"))] if authorization else []
    if header is not None:
        raw.append((wire.HEADER.encode(), header.encode("latin-1")))
    return StarletteRequest({"type": "http", "method": "POST", "path": "/generate", "headers": raw})


def assert_intake_outcome(params: dict, tenant: str) -> None:
    """What the scheduler finds is always made by the HTTP process: accepted tags, or a marker with a reason."""
    found = wire.find(params.get("custom_params"))
    if found is None:
        return
    assert isinstance(found, dict) and found["tenant"] == tenant
    if "invalid" in found:
        assert found["invalid"] in INTAKE_REASONS and set(found) == {"invalid", "tenant"}
    else:
        assert isinstance(found["ts"], float)
        wire.parse({k: v for k, v in found.items() if k not in ("ts", "tenant")})
    for value in found.values():  # SGLang's msgpack IPC carries one flat level of scalars
        assert not isinstance(value, (dict, list, tuple))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(headers, st.sampled_from(["", "Bearer k1"]))
def test_any_tag_header_is_accepted_or_refused_with_a_reason_never_an_error(header, authorization):
    from test_tag_pipeline import accept_tags

    from agentcache.server_ext.tenancy import tenant_of_request

    request = starlette_request(header, authorization)
    params: dict = {"max_new_tokens": 1}
    accept_tags(params, request, None, None, [1, 2, 3])
    assert_intake_outcome(params, tenant_of_request(request))


@settings(max_examples=300, deadline=None)
@given(st.one_of(json_ish, tag_objects, st.builds(lambda d: {"invalid": d, "tenant": "victim"}, st.text(max_size=30))))
def test_any_tag_object_in_the_body_is_accepted_or_refused_with_a_reason_never_an_error(obj):
    from test_tag_pipeline import accept_tags

    from agentcache.server_ext.tenancy import tenant_of_request

    request = starlette_request(None, "Bearer k2")
    params = {"custom_params": {"agentcache": obj}}
    accept_tags(params, request, None, None, [1, 2, 3])
    assert_intake_outcome(params, tenant_of_request(request))


def test_rendered_prefixes_stay_within_their_bounds_whatever_is_rendered():
    from agentcache.server_ext.intake import RenderedPrefixes

    cache = RenderedPrefixes(max_entries=8, max_tokens=10_000, max_tokens_each=4_000)
    for i in range(200):
        cache.put(f"k{i}", list(range(i * 97 % 6_000)))
        assert len(cache) <= 8 and cache.tokens <= 10_000
        assert cache.tokens == sum(len(cache.get(k) or ()) for k in list(cache._ids))
    cache.put("huge", list(range(4_001)))
    assert cache.get("huge") is None, "a prefix longer than max_tokens_each is never kept"
