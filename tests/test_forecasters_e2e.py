"""The live server uses the forecasters it is given: a call graph written in agent names, and a neural model
trained on the app's own recorded trace, both match the agents of the app's live requests.

Agents are the names users know (here LangGraph's node names), the same in the recorder's trace, in a
call graph file and in what the SDK sends; a forecaster that meets an agent it does not know says so.
"""

from __future__ import annotations

import json

import httpx
import pytest
from test_examples import run_example

pytestmark = [pytest.mark.server, pytest.mark.frameworks]

APP = "langgraph_code_assistant.py"
APP_GRAPH = {"planner": ["coder"], "coder": ["tester"], "tester": ["analyzer"], "analyzer": ["coder"]}


def start(tmp_path, name: str, **options):
    from conftest import API_KEY

    from agentcache.server_ext.launcher import ServeOptions, Server, free_port

    opts = ServeOptions(
        model_size="tiny", port=free_port(), max_total_tokens=4000, api_key=API_KEY, log_path=str(tmp_path / name)
    )
    for key, value in options.items():
        setattr(opts, key, value)
    return Server(opts).start(timeout_s=600)


def forecasters(server) -> dict:
    from conftest import API_KEY

    headers = {"Authorization": f"Bearer {API_KEY}"}
    return httpx.get(f"{server.base_url}/agentcache/v1/stats", headers=headers, timeout=60).json()["forecasters"]


def test_a_call_graph_in_agent_names_drives_kvflow_on_live_requests(server, tmp_path):
    graph = tmp_path / "graph.json"
    graph.write_text(json.dumps(APP_GRAPH))
    kvflow = start(tmp_path, "kvflow.log", policy="kvflow", call_graph=str(graph))
    try:
        run_example(kvflow, APP, "--workflows", "2")
        coverage = forecasters(kvflow)["call graph"]
        assert coverage["known_agent"] >= 6 and coverage["unknown_agent"] == 0, coverage
        assert coverage["source"] == f"the call graph {graph}"
    finally:
        kvflow.stop()


def test_a_model_trained_on_the_apps_recorded_trace_forecasts_its_live_requests(server, tmp_path):
    from agentcache.cli import main as agentcache

    trace = tmp_path / "app.jsonl"
    run_example(server, APP, "--workflows", "3", "--record", str(trace))
    model = tmp_path / "model.pt"
    assert agentcache(["train", str(trace), "-o", str(model), "--epochs", "30", "--quiet"]) == 0
    neural = start(tmp_path, "neural.log", predictor=f"neural:{model}")
    try:
        run_example(neural, APP, "--workflows", "2")
        coverage = forecasters(neural)["neural"]
        assert coverage["known_agent"] >= 6 and coverage["unknown_agent"] == 0, coverage
        assert coverage["source"] == f"the neural model {model}"
        # Another app's agents are unknown to this model: counted, named, logged, and the server serves on.
        run_example(neural, "autogen_group_chat.py", "--workflows", "1")
        coverage = forecasters(neural)["neural"]
        assert coverage["unknown_agent"] > 0 and "planner" not in coverage["unknown_agents"], coverage
        assert set(coverage["unknown_agents"]) & {"SelectorGroupChatManager", "critic", "summarizer"}
        log = (tmp_path / "neural.log").read_text()
        assert f"the neural model {model} does not know the live agent" in log
    finally:
        neural.stop()
