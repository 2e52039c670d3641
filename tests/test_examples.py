"""The three framework examples, run as a user would, against the real server with the plugin."""

from __future__ import annotations

import json
import os
import subprocess
import sys
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


@pytest.mark.parametrize("name", sorted(EXPECTED_AGENTS))
def test_the_same_app_without_the_decorator_still_works(server, name):
    before = server.client.get("/agentcache/v1/stats").json()
    summary = run_example(server, name, "--workflows", "1", "--no-agentcache")
    after = server.client.get("/agentcache/v1/stats").json()
    assert summary["workflows"] == 0 and summary["requests"] > 0
    assert after["untagged_requests"] - before["untagged_requests"] == summary["requests"]
    assert after["tagged_requests"] == before["tagged_requests"]


def test_a_recorded_app_replays(server, tmp_path, capsys):
    from agentcache.cli import main
    from agentcache.trace import read_trace

    trace_path = tmp_path / "app.jsonl"
    summary = run_example(server, "langgraph_code_assistant.py", "--workflows", "2", "--record", str(trace_path))
    trace = read_trace(trace_path)
    assert len(trace.requests) == summary["requests"] and len(trace.ended_workflows) == 2
    assert {r.agent for r in trace.requests} <= EXPECTED_AGENTS["langgraph_code_assistant.py"]
    capsys.readouterr()
    assert main(["replay", str(trace_path), "--capacity", "3000", "--policy", "lru,pbkv,belady", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert [r["policy"] for r in rows] == ["lru", "pbkv", "belady"] and rows[0]["requests"] == summary["requests"]
