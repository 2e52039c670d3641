"""Other clients' session and agent forms on the live server (issue 54): each form that names a session becomes a
workflow of the tenant that sent it, with its requests and agents; a final marker or /close_session ends it;
hint-only forms apply to the workflow they ride with; bad values leave the request untagged and counted."""

from __future__ import annotations

import json
import uuid

import httpx
import pytest

from tests.conftest import TENANT_KEYS

pytestmark = pytest.mark.server

SYSTEM = {"role": "system", "content": "You are a terse assistant."}


def chat(server, headers=None, client=None, **body):
    payload = {"model": "default", "max_tokens": 1, "messages": [SYSTEM, {"role": "user", "content": "Say hi."}]}
    r = (client or server.client).post("/v1/chat/completions", json={**payload, **body}, headers=headers or {})
    r.raise_for_status()
    return r.json()


def view(server, workflow, client=None):
    r = (client or server.client).get(f"/agentcache/v1/workflows/{workflow}")
    r.raise_for_status()
    return r.json()


def stats(server):
    return server.client.get("/agentcache/v1/stats").json()


def fresh(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:8]}"


def _session_forms():
    """(form, headers, body, the workflow it names, the agent it names or None): one request's worth each."""
    s = fresh("s")
    return [
        ("sglang_agent_hints", {}, {"agent_hints": {"workflow_id": s + "ah", "agent_id": "planner"}}, s + "ah", "planner"),
        ("sglang_session_id", {}, {"session_id": s + "sg"}, s + "sg", None),
        ("nvext_agent_context", {}, {"nvext": {"agent_context": {"session_id": s + "nv"}}}, s + "nv", None),
        ("nvext older fields", {}, {"nvext": {"agent_context": {"workflow_id": s + "nw", "program_id": "p1"}}}, s + "nw", "p1"),
        ("dynamo_headers", {"X-Dynamo-Session-ID": s + "dy"}, {}, s + "dy", None),
        ("claude_code", {"x-claude-code-session-id": s + "cc", "x-claude-code-agent-id": "ag-7"}, {}, s + "cc", "ag-7"),
        ("codex", {"thread-id": s + "cx"}, {}, s + "cx", None),
        ("codex, older", {"session-id": s + "co"}, {}, s + "co", None),
        ("x_session_id", {"X-Session-ID": s + "xs"}, {}, s + "xs", None),
        ("x_session_id, a subagent", {"x-session-id": s + "xc", "x-parent-session-id": s + "xp"}, {}, s + "xp", s + "xc"),
        ("smg_routing_key", {"X-SMG-Routing-Key": s + "rk"}, {}, s + "rk", None),
        ("prompt_cache_key", {}, {"prompt_cache_key": s + "pk"}, s + "pk", None),
    ]  # fmt: skip


def test_each_form_that_names_a_session_makes_a_workflow_with_its_requests_and_agents(server):
    for form, headers, body, workflow, agent in _session_forms():
        chat(server, headers, **body)
        chat(server, headers, **body)
        w = view(server, workflow)
        assert w["active"] and w["requests"] == 2, f"{form}: {w}"
        agents = w["agents"]
        assert sum(agents.values()) == 2 and len(agents) == 1, f"{form}: one agent, two calls: {agents}"
        if agent is not None:
            assert agent in agents, f"{form}: the form's agent id names the agent: {agents}"
        else:
            assert next(iter(agents)).startswith("a:"), f"{form}: no agent id: the fingerprint rule"


def test_a_plain_openai_client_sends_forms_with_extra_headers_and_extra_body(server):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(
        base_url=f"{server.base_url}/v1", api_key=server.client.headers["authorization"].split()[-1], max_retries=0
    )
    session = fresh("oa")
    for _ in range(2):
        client.chat.completions.create(
            model="default",
            max_tokens=1,
            messages=[SYSTEM, {"role": "user", "content": "Say hi."}],
            extra_headers={"x-claude-code-session-id": session},
            extra_body={"agent_hints": {"agent_id": "coder", "tool_name": "run_tests"}},
        )
    w = view(server, session)
    assert w["active"] and w["requests"] == 2 and w["agents"] == {"coder": 2}, "agent_hints ride with Claude Code's"


def test_the_final_header_and_session_final_end_the_workflow(server):
    session = fresh("final")
    chat(server, {"x-dynamo-session-id": session})
    assert view(server, session)["active"]
    chat(server, {"x-dynamo-session-id": session, "x-dynamo-session-final": "true"})
    w = view(server, session)
    assert not w["active"] and w["ended"] and w["requests"] == 2
    other = fresh("final-body")
    chat(server, nvext={"agent_context": {"session_id": other, "session_final": True}})
    assert not view(server, other)["active"]


def test_a_subagents_final_marker_ends_the_agent_not_the_workflow(server):
    root = fresh("root")
    chat(server, {"x-dynamo-session-id": root})
    before = stats(server)["tool_events"]["agent_done"]
    chat(
        server,
        {"x-dynamo-session-id": root + "-sub", "x-dynamo-parent-session-id": root, "x-dynamo-session-final": "1"},
    )
    w = view(server, root)
    assert w["active"] and w["requests"] == 2 and root + "-sub" in w["agents"]
    assert stats(server)["tool_events"]["agent_done"] == before + 1


def test_reuse_hint_evict_says_the_agent_is_done(server):
    before = stats(server)["tool_events"]["agent_done"]
    session = fresh("evict")
    chat(server, {"x-session-id": session}, agent_hints={"agent_id": "critic", "reuse_hint": "evict"})
    assert stats(server)["tool_events"]["agent_done"] == before + 1
    assert view(server, session)["agents"] == {"critic": 1}


def test_close_session_ends_the_workflow_and_sglang_answers_as_ever(server):
    session = fresh("closed")
    chat(server, session_id=session)
    assert view(server, session)["active"]
    r = server.client.post("/close_session", json={"session_id": session})
    assert r.status_code == 200
    w = view(server, session)
    assert not w["active"] and w["ended"]


def test_a_tenants_forms_are_scoped_to_that_tenant(server):
    tenant = httpx.Client(
        base_url=server.base_url, headers={"Authorization": f"Bearer {TENANT_KEYS['tenant-a']}"}, timeout=120
    )
    with tenant:
        session = fresh("tenant")
        chat(server, {"x-session-id": session}, client=tenant)
        assert view(server, session, client=tenant)["requests"] == 1
        assert view(server, session)["requests"] == 0, "the operator's namespace has no such workflow"


def test_a_tool_name_starts_a_pause_counted_with_the_tool_events(server):
    before = stats(server)["tool_events"]["tool_start"]
    session = fresh("tool")
    chat(server, {"x-session-id": session}, agent_hints={"tool_name": "search", "expected_tool_duration_ms": 800})
    assert stats(server)["tool_events"]["tool_start"] == before + 1
    assert view(server, session)["requests"] == 1


def test_hint_only_forms_ride_with_the_workflow_and_alone_name_none(server):
    session = fresh("ride")
    chat(server, {"x-session-id": session}, nvext={"agent_hints": {"priority": 2, "osl": 64}})
    assert view(server, session)["requests"] == 1
    before = stats(server)
    chat(server, nvext={"agent_hints": {"priority": 2}})  # no session: an untagged request's implicit workflow
    after = stats(server)
    assert after["untagged_requests"] == before["untagged_requests"] + 1
    assert after["invalid_tags"] == before["invalid_tags"]


def test_bad_values_leave_the_request_untagged_and_counted(server):
    before = stats(server)["invalid_tags"]
    answer = chat(server, agent_hints={"workflow_id": 42})
    assert answer["choices"], "served as ever"
    chat(server, {"x-session-id": "x" * 300})
    after = stats(server)["invalid_tags"]
    for reason in ("bad_hint_sglang_agent_hints", "bad_hint_x_session_id"):
        assert after.get(reason, 0) == before.get(reason, 0) + 1, reason


def test_generate_takes_the_forms_too(server):
    session = fresh("gen")
    body = {"text": "Once upon a time", "session_id": session, "sampling_params": {"max_new_tokens": 1}}
    server.client.post("/generate", json=body).raise_for_status()
    hinted = {"text": ["One", "Two"], "agent_hints": {"workflow_id": session + "-b", "agent_id": "batch"}}
    server.client.post("/generate", json={**hinted, "sampling_params": {"max_new_tokens": 1}}).raise_for_status()
    assert view(server, session)["requests"] == 1
    assert view(server, session + "-b")["agents"] == {"batch": 2}, "each prompt of a batch a call of the workflow"


def test_forms_packed_by_the_front_reach_the_intake(server):
    session = fresh("packed")
    packed = json.dumps({"headers": {"x-session-id": session}, "body": {"agent_hints": {"agent_id": "fwd"}}})
    chat(server, {"x-request-id-agentcache-client": packed})
    assert view(server, session)["agents"] == {"fwd": 1}
