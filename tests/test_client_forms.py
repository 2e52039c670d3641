"""What other clients' forms become in the HTTP process (server_ext/client_forms.py), without a server: the tags,
the refusal, the follow-ups once answered, /close_session's end."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

from agentcache.client_hints import ClientHints
from agentcache.server_ext import client_forms
from agentcache.tags import Stamped, Tags


def request(headers=None, body=None):
    req = SimpleNamespace(scope={}, headers=headers or {})
    if body is not None:
        req._json = body  # as Starlette keeps the body FastAPI parsed
    return req


def test_hints_come_from_headers_and_the_parsed_body_once_per_request():
    req = request({"x-session-id": "s1"}, {"agent_hints": {"agent_id": "coder"}})
    hints = client_forms.hints_of(req)
    assert (hints.workflow, hints.agent) == ("s1", "coder")
    req.headers = {}
    assert client_forms.hints_of(req) is hints, "read once, kept for the request's other hooks"
    assert client_forms.hints_of(None) is None


def test_hints_packed_by_the_front_are_read_as_sent():
    packed = json.dumps({"headers": {"thread-id": "t9"}, "body": {"prompt_cache_key": "u"}})
    assert client_forms.hints_of(request({"x-request-id-agentcache-client": packed}, {})).workflow == "t9"


def test_a_broken_request_reads_as_no_forms():
    broken = SimpleNamespace(scope={}, headers=None, _json={"session_id": "s"})
    assert client_forms.hints_of(broken) is None


def test_hinted_tags_refusals_and_none():
    hints = ClientHints("x_session_id", workflow="s", agent="coder", app="research")
    stamped = client_forms.hinted("t", hints, "a:fp", 12)
    tags = stamped.tags
    assert (stamped.tenant, tags.workflow, tags.agent, tags.agent_name, tags.fixed_tokens) == (
        "t",
        "s",
        "a:fp",
        "coder",
        12,
    )
    assert not tags.implicit and tags.app == "research"
    refused = client_forms.hinted("t", ClientHints(refused=("bad_hint_codex",)), "a:fp", None)
    assert (refused.tags, refused.reason) == (None, "bad_hint_codex")
    assert client_forms.hinted("t", ClientHints(osl=5), "a:fp", None) is None, "hints alone: implicit tags"
    assert client_forms.hinted("t", None, "a:fp", None) is None


def stamp(workflow, agent="a:fp", name=None, implicit=False, tenant="t"):
    return Stamped(tenant, Tags(workflow=workflow, agent=agent, agent_name=name, implicit=implicit))


def test_follow_ups_once_per_workflow_and_agent():
    hints = ClientHints("x", workflow="w", final=True, tool="search", reuse_hint="evict")
    ops = client_forms.follow_ups(
        hints, [stamp("w", name="coder"), stamp("w", name="coder"), stamp("~i", implicit=True)]
    )
    assert ops == [
        (
            "tool_events",
            {"tenant": "t", "events": [["tool_start", "w", "coder", "search"], ["agent_done", "w", "coder"]]},
        ),
        ("end", {"tenant": "t", "workflow": "w"}),
    ]
    sub = ClientHints("x", workflow="root", agent="child", subagent=True, final=True)
    assert client_forms.follow_ups(sub, [stamp("root", name="child")]) == [
        ("tool_events", {"tenant": "t", "events": [["agent_done", "root", "child"]]})
    ], "a subagent's final marker: that agent is done, the workflow goes on"
    assert client_forms.follow_ups(ClientHints("x", workflow="w", reuse_hint="keep"), [stamp("w")]) == []
    assert client_forms.follow_ups(None, [stamp("w")]) == []


def test_close_session_ends_the_workflow_after_sglang_closed_its_session(monkeypatch):
    sent, closed = [], []

    async def control(op, payload):
        sent.append((op, payload["tenant"], payload["workflow"]))
        return [{"ended": True}]

    async def original(tm, obj, req=None):
        closed.append(obj.session_id)

    monkeypatch.setattr(client_forms, "control", control)
    req = request({"x-agentcache-tenant": "lab"})
    asyncio.run(client_forms.around_close_session(original, None, SimpleNamespace(session_id="s1"), req))
    assert closed == ["s1"] and sent == [("end", "/lab", "s1")]
    sent.clear()
    asyncio.run(client_forms.around_close_session(original, None, SimpleNamespace(session_id="\x00"), req))
    assert sent == [], "no workflow has an id that breaks the id rules"
