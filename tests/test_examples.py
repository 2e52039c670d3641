"""The three framework examples, and a plain openai app with tools, run as a user would, against the real server
with the plugin: every request tagged, every workflow ended, every tool call a tool pause the server heard."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

pytestmark = [pytest.mark.server, pytest.mark.frameworks]

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
EXPECTED_AGENTS = {
    "langgraph_code_assistant.py": {"planner", "coder", "tester", "analyzer"},
    "autogen_group_chat.py": {"SelectorGroupChatManager", "planner", "coder", "critic", "summarizer"},
    "crewai_flow.py": {"Technical Writer", "Editor"},
}


def run_example(server, name: str, *extra: str) -> dict:
    from conftest import API_KEY

    cmd = [sys.executable, str(EXAMPLES / name), "--base-url", server.base_url, "--api-key", API_KEY, "--json", *extra]
    done = subprocess.run(
        cmd, capture_output=True, text=True, timeout=600, cwd=EXAMPLES, env={**os.environ, "PYTHONUNBUFFERED": "1"}
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


# What each example's framework tells as it runs, at least: LangGraph its graph and its router's answers, AutoGen
# its selector chat's graph and each speaker chosen, CrewAI's flow (crews of one task each) each task done.
EXPECTED_PLAN_EVENTS = {
    "langgraph_code_assistant.py": Counter(plan=1, next=3),
    "autogen_group_chat.py": Counter(plan=1, next=9),
    "crewai_flow.py": Counter(agent_done=6),
}


def plan_events(stats: dict) -> Counter:
    return Counter({kind: stats["tool_events"][kind] for kind in ("plan", "next", "agent_done")})


def tool_events(stats: dict) -> Counter:
    return Counter({kind: stats["tool_events"][kind] for kind in ("tool_start", "tool_end", "skipped", "refused")})


@pytest.mark.parametrize("name", sorted(EXPECTED_AGENTS))
def test_example_tags_every_request_and_ends_every_workflow(server, name):
    before = server.client.get("/agentcache/v1/stats").json()
    summary = run_example(server, name, "--workflows", "3")
    after = server.client.get("/agentcache/v1/stats").json()
    assert summary["workflows"] == 3 and summary["requests"] > 3 and summary["prompt_tokens"] > 0
    assert summary["requests"] == sum(sum(agents.values()) for agents in summary["per_workflow"].values())
    assert after["tagged_requests"] - before["tagged_requests"] == summary["requests"], "every request carried tags"
    assert after["untagged_requests"] == before["untagged_requests"]
    for workflow, agents in summary["per_workflow"].items():
        record = server.client.get(f"/agentcache/v1/workflows/{workflow}").json()
        assert record["agents"] == agents, "the server saw each request under the right workflow and agent"
        assert record["ended"] and not record["active"], "the workflow's end reached the server"
        assert set(agents) <= EXPECTED_AGENTS[name]
    assert summary["cached_tokens"] > 0, "agents' fixed prompts were reused"
    heard = tool_events(after) - tool_events(before)
    calls = summary["tool_calls"]
    assert calls >= summary["workflows"], "every workflow ran its tool at least once"
    assert heard == Counter(tool_start=calls, tool_end=calls), "one pause per tool call, each ended, none refused"
    told = plan_events(after) - plan_events(before)  # the framework's plan and decisions (issue 53)
    assert told >= EXPECTED_PLAN_EVENTS[name], told
    sent = 2 * calls + sum(told.values())
    assert summary["tool_events"] == {"sent_events": sent, "dropped_events": 0, "refused_events": 0}


@pytest.mark.parametrize("name", sorted(EXPECTED_AGENTS))
def test_the_same_app_without_the_decorator_still_works(server, name):
    before = server.client.get("/agentcache/v1/stats").json()
    summary = run_example(server, name, "--workflows", "1", "--no-agentcache")
    after = server.client.get("/agentcache/v1/stats").json()
    assert summary["workflows"] == 0 and summary["requests"] > 0
    assert after["untagged_requests"] - before["untagged_requests"] == summary["requests"]
    assert after["tagged_requests"] == before["tagged_requests"]
    assert summary["tool_calls"] > 0 and tool_events(after) == tool_events(before), "no workflow, no tool events"


def test_a_recorded_app_replays(server, tmp_path, capsys):
    from agentcache.cli import main
    from agentcache.trace import ToolEnd, ToolStart, read_trace

    trace_path = tmp_path / "app.jsonl"
    summary = run_example(server, "langgraph_code_assistant.py", "--workflows", "2", "--record", str(trace_path))
    trace = read_trace(trace_path)
    assert len(trace.requests) == summary["requests"] and len(trace.ended_workflows) == 2
    assert {r.agent for r in trace.requests} <= EXPECTED_AGENTS["langgraph_code_assistant.py"]
    starts = [e for e in trace.events if isinstance(e, ToolStart)]
    ends = [e for e in trace.events if isinstance(e, ToolEnd)]
    assert len(starts) == len(ends) == summary["tool_calls"] > 0
    assert {(e.agent, e.tool) for e in starts + ends} == {("tester", "run_tests")}, "the tester waits on its tool"
    capsys.readouterr()
    assert main(["replay", str(trace_path), "--capacity", "3000", "--policy", "lru,pbkv,belady", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert [r["policy"] for r in rows] == ["lru", "pbkv", "belady"] and rows[0]["requests"] == summary["requests"]


PLAIN_APP = """
import json, sys
import httpx, openai
import agentcache_sdk as ac


class ScriptedToolCalls(httpx.BaseTransport):
    # The server answers every request; where tools are offered and no tool result follows yet, its answer is
    # replaced by a call of run_tests, streamed where asked (random weights never ask for a tool, and SGLang's
    # tool_choice="required" grammar lets the random model loop on whitespace to max_tokens).
    def __init__(self):
        self.inner, self.calls = httpx.HTTPTransport(), 0

    def handle_request(self, request):
        response = self.inner.handle_request(request)
        body = json.loads(request.content)
        if not body.get("tools") or any(m["role"] == "tool" for m in body["messages"]):
            return response
        response.read()
        self.calls += 1
        call = {"id": f"call-{self.calls}", "type": "function", "function": {"name": "run_tests", "arguments": "{}"}}
        if not body.get("stream"):
            data = response.json()
            data["choices"][0].update(message={"role": "assistant", "content": None, "tool_calls": [call]},
                                      finish_reason="tool_calls")
            return httpx.Response(200, json=data)
        head = {"id": "x", "object": "chat.completion.chunk", "created": 0, "model": "default"}
        chunks = [{"index": 0, "delta": {"role": "assistant", "tool_calls": [{"index": 0, **call}]}, "finish_reason": None},
                  {"index": 0, "delta": {}, "finish_reason": "tool_calls"}]
        sse = "".join(f"data: {json.dumps({**head, 'choices': [c]})}\\n\\n" for c in chunks) + "data: [DONE]\\n\\n"
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=Streamed(sse.encode()))


class Streamed(httpx.SyncByteStream):  # read as it comes, as a server's stream is (bytes given whole are read at once)
    def __init__(self, data):
        self.data = data

    def __iter__(self):
        yield self.data


base_url, api_key = sys.argv[1:]
ac.configure(base_url=base_url)
http = httpx.Client(transport=ScriptedToolCalls())
client = openai.OpenAI(base_url=base_url + "/v1", api_key=api_key, max_retries=0, http_client=http)
tools = [{"type": "function", "function": {"name": "run_tests", "description": "Run the tests.",
                                           "parameters": {"type": "object", "properties": {}}}}]
asked = 0
for i in range(3):
    with ac.workflow():
        messages = [{"role": "system", "content": "You are the coder. " * 20}, {"role": "user", "content": f"task {i}"}]
        chat = dict(model="default", tools=tools, max_tokens=4, temperature=0)
        if i == 2:  # streamed
            calls = {}
            for chunk in client.chat.completions.create(messages=messages, stream=True, **chat):
                for call in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
                    calls.setdefault(call.index, call)
            calls = [{"id": c.id, "type": "function", "function": {"name": c.function.name, "arguments": "{}"}}
                     for c in calls.values()]
        else:
            message = client.chat.completions.create(messages=messages, **chat).choices[0].message
            calls = [c.model_dump() for c in message.tool_calls or []]
        asked += bool(calls)
        messages.append({"role": "assistant", "content": "", "tool_calls": calls})
        messages += [{"role": "tool", "tool_call_id": c["id"], "content": "4 passed"} for c in calls]
        client.chat.completions.create(messages=messages, **chat)  # the agent's next call reads the result
ac.flush(10)
print(json.dumps({"asked": asked, **ac.stats()}))
"""


def test_a_plain_openai_app_with_tools_sends_tool_events(server):
    """No framework: an answer with tool calls (scripted, as the examples' are) starts the agent's pause, its next
    request ends it; non-streamed and streamed."""
    from conftest import API_KEY

    before = server.client.get("/agentcache/v1/stats").json()
    done = subprocess.run(
        [sys.executable, "-c", PLAIN_APP, server.base_url, API_KEY], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    after = server.client.get("/agentcache/v1/stats").json()
    assert summary["asked"] == 3
    assert tool_events(after) - tool_events(before) == Counter(tool_start=3, tool_end=3)
    assert summary["sent_events"] == 6 and summary["dropped_events"] == summary["refused_events"] == 0
