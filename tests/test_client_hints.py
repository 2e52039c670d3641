"""Other stacks' session and agent hints (agentcache/client_hints.py): one parser per form, one precedence order,
bad values refused by reason, never an error."""

from __future__ import annotations

import pytest

from agentcache.client_hints import PRECEDENCE, read_client_hints, routing_key


def read(headers=None, body=None):
    return read_client_hints(headers or {}, body)


# ---------------------------------------------------------------- each form


def test_nothing_gives_none():
    assert read({"authorization": "Bearer k", "content-type": "application/json"}, {"model": "m"}) is None
    assert read_client_hints(None, None) is None


def test_sglang_agent_hints_name_workflow_agent_tool_and_reuse():
    body = {
        "agent_hints": {
            "workflow_id": "wf-1",
            "agent_id": "coder",
            "step_id": "s3",
            "step_index": 2,
            "total_steps": 5,
            "parent_step_id": "s2",
            "children_step_ids": ["s4", "s5"],
            "tool_name": "run_tests",
            "expected_tool_duration_ms": 2500,
            "cache_ttl_ms": 30000,
            "reuse_hint": "evict",
        }
    }
    h = read(body=body)
    assert (h.form, h.workflow, h.agent) == ("sglang_agent_hints", "wf-1", "coder")
    assert (h.tool, h.tool_seconds, h.reuse_hint) == ("run_tests", 2.5, "evict")
    assert not h.final and not h.subagent and h.refused == ()


def test_sglang_session_id():
    h = read(body={"session_id": "sess-9"})
    assert (h.form, h.workflow, h.agent) == ("sglang_session_id", "sess-9", None)


def test_nvext_agent_context_and_its_older_fields():
    h = read(body={"nvext": {"agent_context": {"session_id": "d1", "session_final": True}}})
    assert (h.form, h.workflow, h.final, h.subagent) == ("nvext_agent_context", "d1", True, False)
    child = read(body={"nvext": {"agent_context": {"session_id": "d2", "parent_session_id": "d1"}}})
    assert (child.workflow, child.agent, child.parent, child.subagent) == ("d1", "d2", "d1", True)
    old = {"workflow_type_id": "research", "workflow_id": "w7", "program_id": "p2", "parent_program_id": "p1"}
    h = read(body={"nvext": {"agent_context": old}})
    assert (h.workflow, h.agent, h.app, h.parent_agent) == ("w7", "p2", "research", "p1")


def test_dynamo_headers_with_a_parent_and_the_final_header():
    h = read({"X-Dynamo-Session-ID": "root"})
    assert (h.form, h.workflow, h.agent, h.final) == ("dynamo_headers", "root", None, False)
    h = read({"x-dynamo-session-id": "child", "x-dynamo-parent-session-id": "root", "x-dynamo-session-final": "true"})
    assert (h.workflow, h.agent, h.subagent, h.final) == ("root", "child", True, True)
    same = read({"x-dynamo-session-id": "root", "x-dynamo-parent-session-id": "root"})
    assert (same.workflow, same.subagent) == ("root", False), "a parent equal to the session names none (Dynamo)"


def test_claude_code_headers():
    main = read({"x-claude-code-session-id": "cc-1"})
    assert (main.form, main.workflow, main.agent, main.subagent) == ("claude_code", "cc-1", None, False)
    sub = read(
        {"x-claude-code-session-id": "cc-1", "x-claude-code-agent-id": "ag-2", "x-claude-code-parent-agent-id": "ag-1"}
    )
    assert (sub.workflow, sub.agent, sub.subagent, sub.parent_agent) == ("cc-1", "ag-2", True, "ag-1")


def test_codex_headers_new_and_old():
    assert read({"thread-id": "t1"}).workflow == "t1"
    assert read({"session-id": "old"}).workflow == "old"
    assert read({"thread-id": "t1", "session-id": "old"}).workflow == "t1"
    sub = read({"thread-id": "t2", "x-codex-parent-thread-id": "t1"})
    assert (sub.form, sub.workflow, sub.agent, sub.subagent) == ("codex", "t1", "t2", True)


def test_x_session_id_opencode_and_vllm_router():
    assert read({"X-Session-ID": "oc"}).workflow == "oc"
    sub = read({"x-session-id": "oc-2", "x-parent-session-id": "oc"})
    assert (sub.form, sub.workflow, sub.agent) == ("x_session_id", "oc", "oc-2")


def test_per_user_keys():
    h = read({"x-smg-routing-key": "user-1"})
    assert (h.form, h.workflow, h.per_user) == ("smg_routing_key", "user-1", True)
    h = read(body={"prompt_cache_key": "user-2"})
    assert (h.form, h.workflow, h.per_user) == ("prompt_cache_key", "user-2", True)


def test_hint_only_forms_ride_with_the_workflow():
    body = {"agent_hints": {"agent_id": "critic", "tool_name": "search"}, "nvext": {"agent_hints": {"priority": 3}}}
    h = read({"x-session-id": "s"}, body)
    assert (h.form, h.workflow, h.agent, h.tool, h.priority) == ("x_session_id", "s", "critic", "search", 3)
    alone = read(body={"nvext": {"agent_hints": {"osl": 100, "speculative_prefill": True}}})
    assert alone.workflow is None and alone.osl == 100


# ---------------------------------------------------------------- precedence


def test_one_precedence_order():
    headers = {
        "x-dynamo-session-id": "dyn",
        "x-claude-code-session-id": "cc",
        "thread-id": "codex",
        "x-session-id": "xs",
        "x-smg-routing-key": "rk",
    }
    body = {"agent_hints": {"workflow_id": "ah"}, "session_id": "sg", "prompt_cache_key": "pk"}
    assert read(headers, body).workflow == "ah"
    del body["agent_hints"]
    assert read(headers, body).workflow == "sg"
    del body["session_id"]
    assert read(headers, body).workflow == "dyn"
    for name, expected in (("x-dynamo-session-id", "cc"), ("x-claude-code-session-id", "codex"), ("thread-id", "xs")):
        del headers[name]
        assert read(headers, body).workflow == expected
    del headers["x-session-id"]
    assert read(headers, body).form == "smg_routing_key", "per-user keys last: the routing key, then"
    del headers["x-smg-routing-key"]
    assert read(headers, body).form == "prompt_cache_key"
    assert PRECEDENCE[-2:] == ("smg_routing_key", "prompt_cache_key")


# ---------------------------------------------------------------- bad values


@pytest.mark.parametrize(
    ("headers", "body", "reason"),
    [
        ({}, {"agent_hints": "wf"}, "bad_hint_sglang_agent_hints"),
        ({}, {"agent_hints": {"workflow_id": 7}}, "bad_hint_sglang_agent_hints"),
        ({}, {"agent_hints": {"workflow_id": "w", "reuse_hint": "forever"}}, "bad_hint_sglang_agent_hints"),
        ({}, {"agent_hints": {"workflow_id": "w", "step_index": -1}}, "bad_hint_sglang_agent_hints"),
        ({}, {"agent_hints": {"workflow_id": "w", "expected_tool_duration_ms": "5s"}}, "bad_hint_sglang_agent_hints"),
        ({}, {"agent_hints": {"workflow_id": "w", "children_step_ids": ["a"] * 300}}, "bad_hint_sglang_agent_hints"),
        ({}, {"session_id": "x" * 257}, "bad_hint_sglang_session_id"),
        (
            {},
            {"nvext": {"agent_context": {"session_id": "s", "session_final": "maybe"}}},
            "bad_hint_nvext_agent_context",
        ),
        ({}, {"nvext": []}, "bad_hint_nvext_agent_context"),
        ({"x-dynamo-session-id": "a\x07b"}, {}, "bad_hint_dynamo_headers"),
        ({"x-claude-code-session-id": "s" * 300}, {}, "bad_hint_claude_code"),
        ({"thread-id": "t\x00"}, {}, "bad_hint_codex"),
        ({"x-session-id": "\x1b[31m"}, {}, "bad_hint_x_session_id"),
        ({}, {"prompt_cache_key": ["a"]}, "bad_hint_prompt_cache_key"),
    ],
)
def test_a_bad_value_leaves_its_form_out_with_a_reason(headers, body, reason):
    h = read(headers, body)
    assert h is not None and h.workflow is None
    assert reason in h.refused


def test_a_bad_form_falls_through_to_the_next():
    h = read({"x-claude-code-session-id": "cc"}, {"agent_hints": {"workflow_id": ""}})
    assert (h.workflow, h.refused) == ("cc", ("bad_hint_sglang_agent_hints",))


def test_a_bad_final_header_is_refused_not_an_end():
    h = read({"x-session-id": "s", "x-dynamo-session-final": "perhaps"})
    assert (h.workflow, h.final, h.refused) == ("s", False, ("bad_hint_dynamo_headers",))


def test_an_empty_header_says_nothing():
    assert read({"x-session-id": "  "}) is None


# ---------------------------------------------------------------- the routing key


def test_routing_key_prefers_our_tags_then_the_forms():
    tags = {"v": 1, "workflow": "ours", "agent": "a"}
    assert routing_key({"x-session-id": "s"}, {"custom_params": {"agentcache": tags}}) == "ours"
    assert routing_key({}, {"sampling_params": {"custom_params": {"agentcache": tags}}}) == "ours"
    assert routing_key({"x-request-id-agentcache": '{"v":1,"workflow":"hdr","agent":"a"}'}, {}) == "hdr"
    assert routing_key({"X-Session-ID": "s"}, {}) == "s"
    assert routing_key({"x-session-id": "child", "x-parent-session-id": "root"}, {}) == "root"
    assert routing_key({"x-request-id-agentcache": "not json"}, {"prompt_cache_key": "u"}) == "u"
    assert routing_key({}, {}) is None
