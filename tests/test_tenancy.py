"""Tenants isolated by credentials, without a server: the keys file, the key middleware, who a request is,
the per-tenant caps of the workflow registry and the records, and each tenant's own forecaster."""

from __future__ import annotations

import logging

import pytest
from starlette.requests import Request as StarletteRequest

from agentcache.tags import Tags, WorkflowKey, scoped_agent


def write(tmp_path, text: str) -> str:
    path = tmp_path / "keys.txt"
    path.write_text(text)
    return str(path)


# ---------------------------------------------------------------- the keys file


def test_a_keys_file_names_each_tenants_key_and_the_operators(tmp_path):
    from agentcache.server_ext.tenancy import checked_operator_key, load_keys

    keys = load_keys(write(tmp_path, "# tenants\n\noperator: op-key-000\nalice: sk-alice-1\n  bob :  sk-bob-22  \n"))
    assert keys.tenants == {"alice": "sk-alice-1", "bob": "sk-bob-22"} and keys.operator == "op-key-000"
    assert keys.holder("sk-alice-1") == "alice" and keys.holder("sk-bob-22") == "bob"
    assert keys.holder("op-key-000") is None and keys.holder("") is None and keys.holder("sk-alice-") is None
    assert checked_operator_key(keys, None) == checked_operator_key(keys, "op-key-000") == "op-key-000"


@pytest.mark.parametrize(
    "text, says",
    [
        ("alice sk-alice-1\n", ":1: expected `name: key`"),
        ("# c\nal/ice: sk-alice-1\n", ":2: tenant name 'al/ice'"),
        ("alice: short\n", ":1: alice's key must be at least 8"),
        ("alice: sk alice 1\n", ":1: alice's key must be"),
        ("alice: sk-alice-1\nalice: sk-alice-2\n", ":2: 'alice' is named twice"),
        ("alice: sk-alice-1\nbob: sk-alice-1\n", ":2: bob's key is alice's too"),
        ("operator: op-key-000\noperator: op-key-111\n", ":2: 'operator' is named twice"),
    ],
)
def test_a_bad_keys_file_is_refused_naming_the_file_and_the_line(tmp_path, text, says):
    from agentcache.server_ext.config import ConfigError
    from agentcache.server_ext.tenancy import load_keys

    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as caught:
        load_keys(path)
    assert str(caught.value).startswith(path) and says in str(caught.value), str(caught.value)


def test_a_keys_file_needs_one_operator_key_no_tenant_holds(tmp_path):
    from agentcache.server_ext.config import ConfigError
    from agentcache.server_ext.tenancy import checked_operator_key, load_keys

    with pytest.raises(ConfigError, match="needs an operator key"):
        checked_operator_key(load_keys(write(tmp_path, "alice: sk-alice-1\n")), None)
    with pytest.raises(ConfigError, match="differs from --api-key"):
        checked_operator_key(load_keys(write(tmp_path, "operator: op-key-000\n")), "other-key-1")
    with pytest.raises(ConfigError, match="also alice's"):
        checked_operator_key(load_keys(write(tmp_path, "alice: sk-alice-1\n")), "sk-alice-1")
    with pytest.raises(ConfigError, match="No such file"):
        load_keys(str(tmp_path / "missing.txt"))


def test_agentcache_serve_checks_the_keys_file_before_starting(tmp_path, capsys):
    from agentcache.cli import main

    code = main(["serve", "--api-keys-file", write(tmp_path, "alice: sk-alice-1\n")])
    assert code != 0 and "needs an operator key" in capsys.readouterr().err


def test_a_keyless_server_says_it_is_a_development_mode(caplog):
    from agentcache.server_ext.tenancy import log_mode

    with caplog.at_level(logging.WARNING, logger="agentcache"):
        log_mode(None, None)
    assert "DEVELOPMENT MODE" in caplog.text and "every workflow" in caplog.text


# ---------------------------------------------------------------- who a request is


def request(headers: dict[str, str], principal: str | None = None):
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/generate",
        "headers": [(k.encode(), v.encode()) for k, v in headers.items()],
    }
    if principal is not None:
        scope["agentcache.principal"] = principal
    return StarletteRequest(scope)


def test_a_tenant_is_its_keys_holder_and_the_header_only_labels_inside_it():
    from agentcache.server_ext.tenancy import tenant_of_request

    assert tenant_of_request(request({}, "alice")) == "alice"
    assert tenant_of_request(request({"x-agentcache-tenant": "bob"}, "alice")) == "alice/bob"
    assert tenant_of_request(request({"x-request-id-agentcache-tenant": "bob"}, "alice")) == "alice/bob"
    # No tenant key (the operator's, or a keyless server): the operator's namespace, labels inside it.
    assert tenant_of_request(request({"authorization": "Bearer sk-alice-1"})) == ""
    assert tenant_of_request(request({"x-agentcache-tenant": "alice"})) == "/alice"
    # A client cannot name the principal: only the key middleware sets it.
    assert tenant_of_request(request({"agentcache.principal": "alice"})) == ""


def _app(keys):
    from fastapi import FastAPI

    from agentcache.server_ext.tenancy import TenantKeyMiddleware, tenant_of_request

    app = FastAPI()

    async def who(request: StarletteRequest):
        return {"tenant": tenant_of_request(request)}

    for path in ("/generate", "/agentcache/v1/stats", "/flush_cache", "/health"):
        app.add_api_route(path, who, methods=["GET", "POST"])
    app.add_middleware(TenantKeyMiddleware, keys=keys, api_key="op-key-000", admin_api_key=None, fastapi_app=app)
    return app


def test_the_key_middleware_opens_a_tenants_routes_to_its_key_and_the_rest_to_the_operators(tmp_path):
    from fastapi.testclient import TestClient

    from agentcache.server_ext.tenancy import load_keys

    keys = load_keys(write(tmp_path, "operator: op-key-000\nalice: sk-alice-1\n"))
    client = TestClient(_app(keys))
    alice, operator = {"Authorization": "Bearer sk-alice-1"}, {"Authorization": "Bearer op-key-000"}
    assert client.post("/generate", headers=alice).json() == {"tenant": "alice"}
    assert client.get("/agentcache/v1/stats", headers={**alice, "x-agentcache-tenant": "x"}).json() == {
        "tenant": "alice/x"
    }
    refused = client.post("/flush_cache", headers=alice)
    assert refused.status_code == 403 and "operator's key" in refused.json()["error"]
    assert client.post("/flush_cache", headers=operator).json() == {"tenant": ""}
    assert client.post("/generate", headers=operator).json() == {"tenant": ""}
    for headers in ({}, {"Authorization": "Bearer sk-alice-2"}, {"Authorization": "sk-alice-1"}):
        assert client.post("/generate", headers=headers).status_code == 401, headers
    assert client.get("/health").status_code == 200  # open, as SGLang keeps it


def test_salting_puts_a_keyed_tenants_prompts_in_a_namespace_of_their_own():
    from types import SimpleNamespace

    from agentcache.server_ext.tenancy import salt_prefix_cache

    for extra, salted in ((None, "alice\x1f"), ("mine", "alice\x1fmine"), (["x", None], ["alice\x1fx", "alice\x1f"])):
        obj = SimpleNamespace(extra_key=extra)
        salt_prefix_cache(obj, request({}, "alice"))
        assert obj.extra_key == salted
    operators = SimpleNamespace(extra_key="mine")
    salt_prefix_cache(operators, request({}))
    assert operators.extra_key == "mine"


# ---------------------------------------------------------------- agents scoped per tenant


def test_an_agent_is_scoped_by_its_keys_holder_and_unscoped_for_the_operator():
    alice = Tags(workflow="w", agent="a:1", agent_name="planner", tenant="alice/team")
    bob = Tags(workflow="w", agent="a:1", agent_name="planner", tenant="bob")
    assert alice.identity == scoped_agent("alice", "planner") != bob.identity
    assert alice.key == WorkflowKey("alice/team", "w")
    for tenant in ("", "/label"):  # the operator's, and a replay's: the name users know, unchanged
        assert Tags(workflow="w", agent="a:1", agent_name="planner", tenant=tenant).identity == "planner"
    assert Tags(workflow="w", agent="a:1", tenant="bob").identity == scoped_agent("bob", "a:1")


# ---------------------------------------------------------------- per-tenant caps


def test_a_flood_of_new_workflow_ids_from_one_tenant_retires_none_of_anothers():
    from agentcache.policy.workflows import WorkflowRegistry

    registry = WorkflowRegistry(max_active=50, max_active_per_tenant=20)
    victims = [WorkflowKey("bob", f"b{i}") for i in range(5)] + [WorkflowKey("", "op")]
    for key in victims:
        registry.observe(key, "x", 0.0)
    for i in range(1000):
        registry.observe(WorkflowKey(f"alice/{i % 7}", f"a{i}"), "x", 1.0 + i)
    assert all(registry.is_active(key) for key in victims)
    assert len(registry) == 26 and registry.is_active(WorkflowKey("alice/5", "a999"))
    # At the server's cap, the principal holding the most loses its least recent.
    registry = WorkflowRegistry(max_active=10)
    for i in range(8):
        registry.observe(WorkflowKey("alice", f"a{i}"), "x", float(i))
    for i in range(3):
        registry.observe(WorkflowKey("bob", f"b{i}"), "x", 10.0 + i)
    assert len(registry) == 10 and not registry.is_active(WorkflowKey("alice", "a0"))
    assert all(registry.is_active(WorkflowKey("bob", f"b{i}")) for i in range(3))
    registry.end(WorkflowKey("alice", "a1"))
    registry.expire(1e9)
    assert len(registry) == 0


def test_records_and_counters_keep_another_tenants_entries_through_a_flood():
    from agentcache.server_ext.records import TenantCounters, WorkflowRecords

    records = WorkflowRecords(max_records=100, max_per_tenant=30)
    records.on_request(WorkflowKey("bob", "b"), "planner", "a:1")
    records.on_request(WorkflowKey("", "op"), "planner", "a:1")
    for i in range(1000):
        records.on_request(WorkflowKey("alice", f"a{i}"), f"n{i}", "a:2")
    assert records.get(WorkflowKey("bob", "b")) and records.get(WorkflowKey("", "op")) and len(records) == 32
    counters = TenantCounters(max_tenants=100, max_labels_per_tenant=10)
    counters.count("bob", "requests")
    for i in range(1000):
        counters.count(f"alice/{i}", "requests")
    assert counters.of("bob")["requests"] == 1 and len(counters) == 11


def test_each_tenant_forecasts_with_its_own_forecaster():
    from agentcache.predictor import END
    from agentcache.predictor.markov import MarkovPredictor
    from agentcache.predictor.tenants import per_tenant

    forecaster = per_tenant(MarkovPredictor(order=1, max_agents=64))
    bob = [scoped_agent("bob", a) for a in ("planner", "coder")]
    for _ in range(5):
        forecaster.observe([], bob[0])
        forecaster.observe(bob[:1], bob[1])
        forecaster.observe(bob, END)
    before = forecaster.predict(bob[:1])
    for i in range(200):  # alice cycles agent names, and teaches "planner then END"
        alice = scoped_agent("alice", f"agent-{i}")
        forecaster.observe([], alice)
        forecaster.observe([alice], END)
        forecaster.observe([], scoped_agent("alice", "planner"))
        forecaster.observe([scoped_agent("alice", "planner")], END)
    assert forecaster.knows(bob[0]) and forecaster.knows(bob[1])
    assert forecaster.predict(bob[:1]) == before
    assert forecaster.predict([])  # arrivals: both tenants' first agents, by the workflows each started
    assert bob[0] in forecaster.predict([])[0] and scoped_agent("alice", "planner") in forecaster.predict([])[0]


def test_a_fixed_forecaster_serves_every_tenant_by_the_names_it_knows():
    from agentcache.predictor import END
    from agentcache.predictor.static import StaticGraphPredictor
    from agentcache.predictor.tenants import per_tenant

    forecaster = per_tenant(StaticGraphPredictor({"planner": ["coder"], "coder": []}))
    planner = scoped_agent("alice", "planner")
    assert forecaster.knows(planner) and not forecaster.learns_online
    rows = forecaster.predict([planner])
    assert scoped_agent("alice", "coder") in rows[0] and "coder" not in rows[0]
    assert rows[-1][END] == 1.0


def test_cachescouts_learner_is_each_tenants_own_and_bounded():
    from agentcache.policy.cachescout import MAX_AGENTS, CacheScoutPolicy
    from agentcache.policy.workflows import WorkflowRegistry

    policy = CacheScoutPolicy(WorkflowRegistry())
    bob = [scoped_agent("bob", a) for a in ("planner", "coder")]
    for i in range(5):  # bob's workflows: planner then coder, always
        key = WorkflowKey("bob", f"b{i}")
        policy.registry.observe(key, bob[0], float(i))
        state, _ = policy.registry.observe(key, bob[1], i + 0.5)
        policy.on_transition(state, bob[0])
    before = (policy.predictability("bob"), policy._survival_from(bob[0]))
    assert before[0] == 1.0 and before[1] == {bob[1]: 0.75}
    for i in range(10_000):  # alice names a new agent at every call, each going anywhere
        key = WorkflowKey("alice", f"a{i % 50}")
        previous = scoped_agent("alice", f"n{i - 1}")
        state, _ = policy.registry.observe(key, scoped_agent("alice", f"n{i}"), 10.0 + i)
        policy.on_transition(state, previous)
    assert (policy.predictability("bob"), policy._survival_from(bob[0])) == before
    alice = policy.learners["alice"]
    assert len(alice.seen) <= MAX_AGENTS and len(alice.counts) <= MAX_AGENTS


def test_kvflow_reads_each_tenants_agents_by_their_names_and_positions():
    from agentcache.policy.kvflow import AgentStepGraph, KVFlowPolicy
    from agentcache.policy.workflows import WorkflowRegistry

    policy = KVFlowPolicy(AgentStepGraph({"planner": ["coder"], "coder": ["tester"], "tester": []}), WorkflowRegistry())
    state, _ = policy.registry.observe(WorkflowKey("alice", "w"), scoped_agent("alice", "planner"), 0.0)
    policy.on_transition(state, None)
    assert policy.agent_steps(scoped_agent("alice", "coder")) == 1
    assert policy.agent_steps(scoped_agent("alice", "tester")) == 2
    assert policy.coverage.known == 1
    # bob's coder is another agent: alice's workflow at planner says nothing about when it runs
    assert policy.agent_steps(scoped_agent("bob", "coder")) == float("inf")
