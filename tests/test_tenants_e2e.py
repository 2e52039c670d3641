"""Tenants isolated by credentials, against the real server (the session fixture's keys file: an operator and
two tenants, tenant-a and tenant-b): a tenant's key reaches its own workflows alone, and one tenant's flood of
workflow ids and agent names leaves another's workflows active and its agents' forecasts in place."""

from __future__ import annotations

import random

import httpx
import pytest
from conftest import API_KEY, TENANT_KEYS, TENANT_WORKFLOW_CAP

pytestmark = pytest.mark.server

A = {"Authorization": f"Bearer {TENANT_KEYS['tenant-a']}"}
B = {"Authorization": f"Bearer {TENANT_KEYS['tenant-b']}"}
OPERATOR = {"Authorization": f"Bearer {API_KEY}"}


def ids(seed: str, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(10, 600) for _ in range(n)]


def generate(server, who, seed, workflow, agent_name="worker", n=24):
    tags = {"v": 1, "workflow": workflow, "agent": f"a:{agent_name}", "agent_name": agent_name}
    body = {"input_ids": ids(seed, n), "sampling_params": {"max_new_tokens": 1, "custom_params": {"agentcache": tags}}}
    r = server.client.post("/generate", json=body, headers=who)
    assert r.status_code == 200, r.text
    return r.json()


def get(server, path, who):
    r = server.client.get(f"/agentcache/v1/{path}", headers=who)
    assert r.status_code == 200, r.text
    return r.json()


def end(server, workflow, who):
    r = server.client.post(f"/agentcache/v1/workflows/{workflow}/end", headers=who)
    assert r.status_code == 200, r.text
    return r.json()["ended"]


def test_a_tenants_key_reads_and_ends_its_own_workflows_only(server):
    generate(server, A, "ta-1", "iso-a")
    generate(server, A, "ta-2", "iso-shared")
    generate(server, B, "tb-1", "iso-shared")
    chat = {
        "model": "default",
        "max_tokens": 1,
        "messages": [{"role": "system", "content": "You are A's planner."}, {"role": "user", "content": "plan"}],
        "custom_params": {"agentcache": {"v": 1, "workflow": "iso-chat", "agent": "a:p", "fixed_messages": 1}},
    }
    assert server.client.post("/v1/chat/completions", json=chat, headers=A).status_code == 200
    assert get(server, "workflows/iso-chat", A)["requests"] == 1
    assert get(server, "workflows/iso-chat", B)["requests"] == 0
    assert get(server, "workflows/iso-a", A)["requests"] == 1
    # Whatever B names as its sub-tenant, it stays inside its own namespace.
    for label in (None, "tenant-a", "../tenant-a", ""):
        who = {**B, "x-agentcache-tenant": label} if label is not None else B
        seen = get(server, "workflows/iso-a", who)
        assert seen["requests"] == 0 and not seen["active"], (label, seen)
        assert not end(server, "iso-a", who), label
        assert "iso-a" not in get(server, "stats", who)["workflows"]
    # Nor does the operator's key with a label reach a tenant: a label is a sub-tenant of the key's holder.
    assert get(server, "workflows/iso-a", {**OPERATOR, "x-agentcache-tenant": "tenant-a"})["requests"] == 0
    assert get(server, "workflows/iso-a", A)["active"], "B's ends never reached A's workflow"
    assert (
        get(server, "workflows/iso-shared", B)["requests"] == 1
        and get(server, "workflows/iso-shared", A)["requests"] == 1
    )
    own = get(server, "stats", B)
    assert own["scope"] == "tenant" and set(own["workflows"]) == {"iso-shared"}
    assert "held_tokens" not in own and "forecasters" not in own
    operator = get(server, "stats", OPERATOR)  # the operator sees every tenant
    assert operator["scope"] == "server" and {"tenant-a/iso-a", "tenant-b/iso-shared"} <= set(operator["workflows"])
    # A tenant's key opens inference and its own routes, never the operator's.
    assert server.client.post("/flush_cache", headers=B).status_code == 403
    assert server.client.get("/server_info", headers=B).status_code == 403
    assert (
        httpx.get(
            f"{server.base_url}/agentcache/v1/stats", headers={"Authorization": "Bearer sk-nobody-00"}
        ).status_code
        == 401
    )
    for workflow, who in (("iso-a", A), ("iso-chat", A), ("iso-shared", A), ("iso-shared", B)):
        assert end(server, workflow, who)


def _coverage(server) -> tuple[int, int]:
    forecasters = get(server, "stats", OPERATOR)["forecasters"]
    return (sum(f["known_agent"] for f in forecasters.values()), sum(f["unknown_agent"] for f in forecasters.values()))


def test_one_tenants_flood_of_workflows_and_agent_names_leaves_anothers_in_place(server):
    generate(server, B, "fb-1", "flood-b", "planner")
    generate(server, B, "fb-2", "flood-b", "coder")
    flood = TENANT_WORKFLOW_CAP + 46  # past A's workflow cap, and past the 64 agents a forecaster keeps
    for i in range(flood):
        generate(server, A, f"fa-{i}", f"flood-a-{i}", f"agent-{i}", n=8)
    seen = get(server, "workflows/flood-b", B)
    assert seen["active"] and seen["requests"] == 2, "A's flood retired none of B's workflows"
    assert get(server, "stats", A)["active_workflows"] == TENANT_WORKFLOW_CAP, "A's flood retired A's own"
    assert not get(server, "workflows/flood-a-0", A)["active"]
    assert get(server, f"workflows/flood-a-{flood - 1}", A)["active"]
    known, unknown = _coverage(server)
    generate(server, B, "fb-3", "flood-b2", "planner")  # B's forecaster still knows its planner
    after_known, after_unknown = _coverage(server)
    assert (after_known - known, after_unknown - unknown) == (1, 0)
    for workflow in ("flood-b", "flood-b2"):
        assert end(server, workflow, B)
    for i in range(flood - TENANT_WORKFLOW_CAP, flood):
        end(server, f"flood-a-{i}", A)
