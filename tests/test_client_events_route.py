"""Events from a client (issues 52 and 53: tool calls, the app's plan, next and agent_done):
``POST /agentcache/v1/events`` read and checked in the HTTP process (server_ext/client_events.py), heard by the
policy in the scheduler (server_ext/cache.py), counted per tenant in the statistics; the route against the live
server (the session fixture's keys file: tenant-a and tenant-b)."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import API_KEY, TENANT_KEYS

from agentcache.server_ext.client_events import MAX_EVENTS, BatchError, EventCounts, parse_batch
from agentcache.server_ext.control_limits import RateLimiter
from agentcache.tags import WorkflowKey, scoped_agent

NONE = dict.fromkeys(("tool_start", "tool_end", "next", "agent_done", "plan", "skipped", "refused"), 0)


def event(kind="tool_start", workflow="w", agent="coder", tool="pytest", **more):
    return {"type": kind, "workflow": workflow, "agent": agent, "tool": tool, **more}


def body(*events) -> bytes:
    return json.dumps({"events": list(events)}).encode()


# ---------------------------------------------------------------- the body, read in the HTTP process


def test_a_batch_keeps_its_known_events_in_order_and_skips_types_it_does_not_know():
    batch = parse_batch(body(event(), event("tool_plan", extra=[1]), event("tool_end", agent="研究")))
    assert batch.events == [["tool_start", "w", "coder", "pytest"], ["tool_end", "w", "研究", "pytest"]]
    assert batch.skipped == 1


@pytest.mark.parametrize(
    ("raw", "error", "events"),
    [
        (b"{not json", "the body is not JSON", 1),
        (b"[" * 5000 + b"]" * 5000, "the body is not JSON", 1),  # too deep: refused, never a RecursionError
        (b'{"events": {}}', 'the body must be an object {"events": [...]}', 1),
        (b"[]", 'the body must be an object {"events": [...]}', 1),
        (body(), "events: 0 events; a batch holds 1 to 256", 0),
        (body(*[event()] * (MAX_EVENTS + 1)), "events: 257 events; a batch holds 1 to 256", 257),
        (body(event(), 5), "events[1]: must be an object, got int", 2),
        (body(event(), event(kind=7)), "events[1].type: must be a non-empty string, got 7", 2),
        (body(event(), event(), event("tool_end", tool="")), "events[2].tool: 'tool' must be a non-empty string", 3),
        (body(event(workflow="x" * 257)), "events[0].workflow: 'workflow' is 257 characters (at most 256)", 1),
        (body(event(agent="a\nb")), "events[0].agent: 'agent' contains non-printable characters", 1),
        (body(event("tool_end", tool=None)), "events[0].tool: 'tool' must be a non-empty string, got NoneType", 1),
    ],
)
def test_a_batch_with_any_invalid_event_is_refused_whole_naming_the_event_and_field(raw, error, events):
    with pytest.raises(BatchError) as refused:
        parse_batch(raw)
    assert str(refused.value).startswith(error) and refused.value.events == events


def test_skipped_and_refused_counts_are_per_tenant_and_the_operators_are_everyones():
    counts = EventCounts()
    counts.count("a", "refused", 3)
    counts.count("b", "skipped", 2)
    counts.count("b", "refused", 0)
    assert counts.of("a", operator=False) == {"skipped": 0, "refused": 3}
    assert counts.of("b", operator=False) == {"skipped": 2, "refused": 0}
    assert counts.of("", operator=True) == {"skipped": 2, "refused": 3}


def test_the_event_rate_takes_one_token_per_event():
    now = [0.0]
    limiter = RateLimiter(rate=100, burst=256, clock=lambda: now[0])
    assert limiter.take("a", 200) == 0.0
    assert limiter.take("a", 100) == pytest.approx(0.44), "44 events short, at 100 a second"
    now[0] += 0.44
    assert limiter.take("a", 100) == 0.0


# ---------------------------------------------------------------- the scheduler's side


def scheduler_with_cache():
    from types import SimpleNamespace

    from agentcache.replay.cpu_cache import build_cache
    from agentcache.server_ext.cache import AgentCache

    return SimpleNamespace(tree_cache=build_cache(1024, cache_class=AgentCache))


def control(scheduler, op, payload):
    from agentcache.server_ext.control import handle_control
    from agentcache.server_ext.ipc import AgentCacheControl

    out = handle_control(scheduler, AgentCacheControl(rid="r", op=op, payload=json.dumps(payload)))
    return out.ok, json.loads(out.result)


def test_the_scheduler_hands_the_policy_each_event_in_order_scoped_to_the_tenant_as_tags_are():
    scheduler = scheduler_with_cache()
    cache = scheduler.tree_cache
    heard = []
    cache.policy.on_tool_start = lambda *args: heard.append(("start", *args))
    cache.policy.on_tool_end = lambda *args: heard.append(("end", *args))
    events = [["tool_start", "w", "coder", "pytest"], ["tool_end", "w", "coder", "pytest"]]
    assert control(scheduler, "tool_events", {"tenant": "t/lab", "ts": 5.0, "events": events}) == (True, {"applied": 2})
    assert control(scheduler, "tool_events", {"tenant": "", "ts": 4.0, "events": events[:1]}) == (True, {"applied": 1})
    assert heard == [
        ("start", WorkflowKey("t/lab", "w"), scoped_agent("t", "coder"), "pytest", 5.0),
        ("end", WorkflowKey("t/lab", "w"), scoped_agent("t", "coder"), "pytest", 5.0),
        ("start", WorkflowKey("", "w"), "coder", "pytest", 5.0),  # the operator's names unscoped; the clock never back
    ]
    ok, own = control(scheduler, "stats", {"tenant": "t/lab", "tool_events": {"skipped": 1, "refused": 4}})
    assert ok and own["tool_events"] == {**NONE, "tool_start": 1, "tool_end": 1, "skipped": 1, "refused": 4}
    assert cache.stats()["tool_events"] == {**NONE, "tool_start": 2, "tool_end": 1}
    assert cache.stats()["pauses"] == {"open": 0, "cut_off": 0} and "pauses" not in own


def test_a_start_opens_a_pause_in_the_policy_for_the_tenants_own_active_workflow_alone():
    scheduler = scheduler_with_cache()
    cache = scheduler.tree_cache
    cache.policy.registry.observe(WorkflowKey("t", "w"), scoped_agent("t", "coder"), 1.0)
    start, end = ["tool_start", "w", "coder", "pytest"], ["tool_end", "w", "coder", "pytest"]
    control(scheduler, "tool_events", {"tenant": "t", "ts": 2.0, "events": [start]})
    assert cache.stats()["pauses"] == {"open": 1, "cut_off": 0}
    control(scheduler, "tool_events", {"tenant": "u", "ts": 3.0, "events": [end, start]})  # u has no workflow w
    assert cache.stats()["pauses"] == {"open": 1, "cut_off": 0}
    control(scheduler, "tool_events", {"tenant": "t", "ts": 4.0, "events": [end]})
    assert cache.stats()["pauses"] == {"open": 0, "cut_off": 0}


def test_a_policy_that_raises_on_a_tool_event_is_counted_and_the_rest_of_the_batch_heard(caplog):
    scheduler = scheduler_with_cache()
    cache = scheduler.tree_cache
    ends = []

    def broken(*args):  # noqa: ANN002, ANN202
        raise RuntimeError("a bug in the policy")

    cache.policy.on_tool_start = broken
    cache.policy.on_tool_end = lambda *args: ends.append(args)
    events = [["tool_start", "w", "a", "t"], ["tool_start", "w", "b", "t"], ["tool_end", "w", "a", "t"]]
    assert control(scheduler, "tool_events", {"tenant": "", "ts": 1.0, "events": events}) == (True, {"applied": 3})
    stats = cache.stats()
    assert stats["policy_faults"] == {"a tool start": 2} and stats["policy"] == "pbkv", "counted, and kept"
    assert len(ends) == 1 and stats["tool_events"]["tool_start"] == 2
    assert len([r for r in caplog.records if "failed in a tool start" in r.getMessage()]) == 1


# ---------------------------------------------------------------- the plan, next and agent_done (issue 53)

GRAPH = {"planner": ["coder"], "coder": ["tester"], "tester": ["coder"]}


def plan_event(app="coding", **plan):
    return {"type": "plan", "app": app, "plan": plan or {"graph": GRAPH, "max_turns": 12}}


def test_plan_next_and_agent_done_are_read_with_the_traces_checks_in_order():
    batch = parse_batch(
        body(
            plan_event(order=["a", "b"], extra_key="ignored"),
            {"type": "next", "workflow": "w", "agents": ["coder", "tester"]},
            event(),
            {"type": "agent_done", "workflow": "w", "agent": "planner"},
        )
    )
    assert batch.events == [
        ["plan", "coding", {"order": ["a", "b"]}],
        ["next", "w", ["coder", "tester"]],
        ["tool_start", "w", "coder", "pytest"],
        ["agent_done", "w", "planner"],
    ]


@pytest.mark.parametrize(
    ("bad", "error"),
    [
        ({"type": "next", "workflow": "w", "agents": []}, "events[1].agents: 'agents' must be a list of 1 to 16 ids"),
        ({"type": "next", "workflow": "w", "agents": [f"a{i}" for i in range(17)]}, "events[1].agents: "),
        ({"type": "next", "workflow": "w", "agents": "coder"}, "events[1].agents: "),
        ({"type": "next", "workflow": "w", "agents": ["coder", "coder"]}, "events[1].agents: 'agents' names an agent"),
        ({"type": "next", "agents": ["coder"]}, "events[1].workflow: 'workflow' must be a non-empty string"),
        ({"type": "agent_done", "workflow": "w"}, "events[1].agent: 'agent' must be a non-empty string"),
        ({"type": "agent_done", "workflow": "w", "agent": "a\nb"}, "events[1].agent: 'agent' contains non-printable"),
        ({"type": "plan", "plan": {"order": ["a"]}}, "events[1].app: 'app' must be a non-empty string"),
        ({"type": "plan", "app": "x", "plan": []}, "events[1].plan: 'plan' must be an object"),
        (plan_event(graph={"a": "b"}), "events[1].plan.graph: "),
        (plan_event(max_turns=0), "events[1].plan.max_turns: 'plan.max_turns' must be an integer >= 1"),
        (plan_event(chain=[["phase"]]), "events[1].plan.chain: "),
        (plan_event(order=["x" * 200 + str(i) for i in range(300)]), "events[1].plan"),
    ],
)
def test_a_bad_plan_next_or_agent_done_refuses_the_batch_naming_the_field(bad, error):
    with pytest.raises(BatchError) as refused:
        parse_batch(body(event(), bad))
    assert str(refused.value).startswith(error), str(refused.value)


def test_the_scheduler_hands_plans_and_decisions_to_the_policy_scoped_by_the_tenants_principal():
    """A tenant's app, plan agents and decisions reach the policy as its own identities: one tenant's plan never
    names another's agents (the operator's, as a replay's, unscoped)."""
    scheduler = scheduler_with_cache()
    cache = scheduler.tree_cache
    heard = []
    cache.policy.on_plan = lambda *args: heard.append(("plan", *args))
    cache.policy.on_next = lambda *args: heard.append(("next", *args))
    cache.policy.on_agent_done = lambda *args: heard.append(("done", *args))
    events = [
        ["plan", "coding", {"graph": GRAPH, "order": ["planner", "coder"], "chain": [["build", ["coder"]]]}],
        ["next", "w", ["coder", "tester"]],
        ["agent_done", "w", "planner"],
    ]
    assert control(scheduler, "tool_events", {"tenant": "t/lab", "ts": 2.0, "events": events}) == (
        True,
        {"applied": 3},
    )
    assert control(scheduler, "tool_events", {"tenant": "", "ts": 3.0, "events": events[:1]})[0]
    (_, app, plan, now), next_, done, (_, operator_app, operator_plan, _) = heard
    t = lambda name: scoped_agent("t", name)  # noqa: E731
    assert (app, now) == (t("coding"), 2.0)
    assert plan.graph == {t("planner"): (t("coder"),), t("coder"): (t("tester"),), t("tester"): (t("coder"),)}
    assert plan.order == (t("planner"), t("coder")) and plan.chain == (("build", (t("coder"),)),)
    assert next_ == ("next", WorkflowKey("t/lab", "w"), (t("coder"), t("tester")), 2.0)
    assert done == ("done", WorkflowKey("t/lab", "w"), t("planner"), 2.0)
    assert operator_app == "coding" and operator_plan.graph == {a: tuple(s) for a, s in GRAPH.items()}
    ok, own = control(scheduler, "stats", {"tenant": "t/lab"})
    assert ok and own["tool_events"] == {**NONE, "next": 1, "agent_done": 1, "plan": 1}
    assert cache.stats()["tool_events"] == {**NONE, "next": 1, "agent_done": 1, "plan": 2}


def test_a_policy_that_raises_on_a_plan_is_counted_and_the_rest_of_the_batch_heard():
    scheduler = scheduler_with_cache()
    cache = scheduler.tree_cache

    def broken(*args):  # noqa: ANN002, ANN202
        raise RuntimeError("a bug in the policy")

    cache.policy.on_plan = broken
    events = [["plan", "coding", {"order": ["a"]}], ["agent_done", "w", "a"]]
    assert control(scheduler, "tool_events", {"tenant": "", "ts": 1.0, "events": events}) == (True, {"applied": 2})
    stats = cache.stats()
    assert stats["policy_faults"] == {"a plan": 1} and stats["tool_events"]["agent_done"] == 1


# ---------------------------------------------------------------- the live server

A = {"Authorization": f"Bearer {TENANT_KEYS['tenant-a']}"}
B = {"Authorization": f"Bearer {TENANT_KEYS['tenant-b']}"}
OPERATOR = {"Authorization": f"Bearer {API_KEY}"}
ROUTE = "/agentcache/v1/events"


def post(server, headers, *events):
    return server.client.post(ROUTE, content=body(*events), headers={**headers, "content-type": "application/json"})


def tool_counts(server, headers):
    r = server.client.get("/agentcache/v1/stats", headers=headers)
    assert r.status_code == 200, r.text
    return r.json()["tool_events"]


@pytest.mark.server
def test_events_are_accepted_counted_per_tenant_and_an_invalid_batch_applies_nothing(server):
    own = {**A, "x-agentcache-tenant": "tool-events"}  # counters of its own, whatever else the suite sends
    operator_before = tool_counts(server, OPERATOR)
    r = post(server, own, event(), event("tool_plan"), event("tool_end"))
    assert (r.status_code, r.json()) == (200, {"accepted": 2, "skipped": 1})
    counts = {**NONE, "tool_start": 1, "tool_end": 1, "skipped": 1}
    assert tool_counts(server, own) == counts

    r = post(server, own, event(), event(), event("tool_end", tool=""))
    assert r.status_code == 400 and r.json()["error"].startswith("events[2].tool: "), r.text
    assert tool_counts(server, own) == {**counts, "refused": 3}, "nothing of it applied"
    refusals = [
        (server.client.post(ROUTE, content=b"{oops", headers=own), 400, "the body is not JSON"),
        (post(server, own, *[event()] * 257), 400, "events: 257 events"),
        (post(server, own), 400, "events: 0 events"),
        (post(server, own, event(kind=["tool_start"])), 400, "events[0].type: "),
        (server.client.post(ROUTE, content=b" " * (5 << 20), headers=own), 413, "this route's limit"),
    ]
    for answer, status, error in refusals:
        assert answer.status_code == status and error in answer.json()["error"], answer.text
    for who in ({"Authorization": "Bearer not-a-key-of-anyone"}, {"Authorization": ""}):
        assert post(server, who, event()).status_code == 401
    assert tool_counts(server, own) == {**counts, "refused": 3 + 1 + 257 + 0 + 1 + 1}
    operator = tool_counts(server, OPERATOR)
    assert operator["tool_start"] - operator_before["tool_start"] == 1, "the operator's counts are everyone's"
    assert operator["refused"] - operator_before["refused"] == 263


def generate(server, headers, workflow, agent):
    tags = {"v": 1, "workflow": workflow, "agent": f"a:{agent}", "agent_name": agent}
    request = {
        "input_ids": [31, 32, 33, 34],
        "sampling_params": {"max_new_tokens": 1, "custom_params": {"agentcache": tags}},
    }
    server.client.post("/generate", json=request, headers=headers).raise_for_status()


def open_pauses(server):
    r = server.client.get("/agentcache/v1/stats", params={"limit": 1})
    assert r.status_code == 200, r.text
    return r.json()["pauses"]["open"]


@pytest.mark.server
def test_the_policy_hears_each_tenants_events_for_its_own_workflows_alone(server):
    """Tenants A and B both run a workflow "shared-tools": B's tool start opens a pause in B's alone (A's end for
    that id closes nothing), A's start for a workflow id only B runs keeps nothing, and B's end closes B's."""
    a, b = {**A, "x-agentcache-tenant": "iso-tools"}, {**B, "x-agentcache-tenant": "iso-tools"}
    generate(server, a, "shared-tools", "coder")
    generate(server, b, "shared-tools", "coder")
    generate(server, b, "b-only-tools", "coder")
    before = open_pauses(server)
    assert post(server, b, event(workflow="shared-tools")).json() == {"accepted": 1, "skipped": 0}
    assert open_pauses(server) == before + 1, "the policy heard B's start"
    assert post(server, a, event("tool_end", workflow="shared-tools")).is_success
    assert post(server, a, event(workflow="b-only-tools")).is_success
    assert open_pauses(server) == before + 1, "A's events reach A's workflows alone"
    assert post(server, b, event("tool_end", workflow="shared-tools")).is_success
    assert open_pauses(server) == before
    assert tool_counts(server, b) == {**NONE, "tool_start": 1, "tool_end": 1}
    assert tool_counts(server, a) == {**NONE, "tool_start": 1, "tool_end": 1}
    assert "pauses" not in server.client.get("/agentcache/v1/stats", headers=a).json(), "the server's, not a tenant's"


@pytest.mark.server
def test_a_flood_of_events_gets_429_with_retry_after_and_the_server_serves_on(server):
    """Each principal may send 4,000 events a second (bursts of 8,000): past that, 429 before the scheduler sees
    them. Ends of tools never started: nothing for the policy to keep."""
    flood = {**B, "x-agentcache-tenant": "tool-flood"}
    batch = [event("tool_end", workflow=f"flood-{i}") for i in range(MAX_EVENTS)]

    def send(_: int):
        return post(server, flood, *batch)

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(send, range(96)))
    statuses = {a.status_code for a in answers}
    assert statuses == {200, 429}, statuses
    refused = next(a for a in answers if a.status_code == 429)
    assert int(refused.headers["Retry-After"]) >= 1 and "too many events" in refused.json()["error"]
    assert server.client.get("/agentcache/v1/health").status_code == 200
    counts = tool_counts(server, flood)
    assert counts["tool_end"] + counts["refused"] == 96 * MAX_EVENTS


@pytest.mark.server
def test_a_tenants_plan_and_decisions_are_accepted_and_counted_as_its_own(server):
    """Plans, next and agent_done go the tool events' way: checked (400 naming the field, nothing applied), counted
    per tenant, heard by the policy as the tenant's own identities (the scheduler test above)."""
    a, b = {**A, "x-agentcache-tenant": "plans"}, {**B, "x-agentcache-tenant": "plans"}
    generate(server, a, "planned", "planner")
    decisions = [
        plan_event(),
        {"type": "next", "workflow": "planned", "agents": ["coder"]},
        {"type": "agent_done", "workflow": "planned", "agent": "planner"},
    ]
    r = post(server, a, *decisions)
    assert (r.status_code, r.json()) == (200, {"accepted": 3, "skipped": 0}), r.text
    r = post(server, a, plan_event(max_turns=-1))
    assert r.status_code == 400 and r.json()["error"].startswith("events[0].plan.max_turns: "), r.text
    assert tool_counts(server, a) == {**NONE, "next": 1, "agent_done": 1, "plan": 1, "refused": 1}
    assert tool_counts(server, b) == NONE
