"""The SDK's tool events against a small local server: the pauses of plain apps, the app's own reports, the
framework reports joining an answer's pause, the recorder, and the one background channel they share with
workflow ends (batched, bounded, never blocking, dropped and counted when the server is away). The real
server and frameworks are in tests/test_examples.py."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import openai
import pytest

import agentcache_sdk as ac
from agentcache.server_ext.launcher import free_port
from agentcache.trace import ToolEnd, ToolStart, read_trace, tool_fields
from agentcache_sdk import _config, _counters, _events

SYSTEM = {"role": "system", "content": "You are the coder."}
TOOLS = [
    {"type": "function", "function": {"name": name, "parameters": {"type": "object", "properties": {}}}}
    for name in ("run_tests", "lint")
]


class Fake(ThreadingHTTPServer):
    """Answers chat requests (with two tool calls where the request offers tools and no tool result follows yet),
    end events, and the events route; records what it receives."""

    def __init__(self, port: int = 0):
        super().__init__(("127.0.0.1", port), _Handler)
        self.received: list[tuple[str, dict, dict]] = []
        self.events_status = 200
        self.events_delay = 0.0  # seconds each events POST takes to answer
        self.workers: list[str] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def batches(self) -> list[list[dict]]:
        return [body["events"] for path, body, _ in self.received if path == "/agentcache/v1/events"]

    def events(self) -> list[dict]:
        return [event for batch in self.batches() for event in batch]

    def paths(self) -> list[str]:
        return [path for path, _, _ in self.received]


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):  # noqa: ANN002
        pass

    def _send(self, status: int, payload: dict | None = None, content_type: str = "application/json") -> None:
        data = json.dumps(payload).encode() if payload is not None else b""
        self.send_response(status)
        self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):  # noqa: N802
        server: Fake = self.server  # type: ignore[assignment]
        if self.path == "/workers" and server.workers is not None:
            workers = [{"url": url, "is_healthy": True} for url in server.workers]
            return self._send(200, {"workers": workers, "total": len(workers), "stats": {}})
        return self._send(404, {})

    def do_POST(self):  # noqa: N802
        server: Fake = self.server  # type: ignore[assignment]
        body = json.loads(self.rfile.read(int(self.headers["content-length"])) or b"{}")
        server.received.append((self.path, body, {k.lower(): v for k, v in self.headers.items()}))
        if self.path == "/agentcache/v1/events":
            time.sleep(server.events_delay)
            if server.events_status != 200:
                return self._send(server.events_status, {"error": "events[0].tool: refused by the fake"})
            return self._send(200, {"accepted": len(body["events"]), "skipped": 0})
        if self.path.endswith("/end"):
            return self._send(200, {"workflow": self.path.split("/")[-2], "ended": True})
        messages = body.get("messages", [])
        asks = bool(body.get("tools")) and not any(m.get("role") == "tool" for m in messages)
        n = len(messages)
        offered = [t.get("function", {}).get("name", "") for t in body.get("tools") or ()]
        handoffs = [name for name in offered if name.startswith("transfer_to_")]  # an AutoGen swarm's handoff
        calls = [
            {"id": f"call_{n}_{i}", "type": "function", "function": {"name": name, "arguments": "{}"}}
            for i, name in enumerate(handoffs[:1] or ("run_tests", "lint"))
        ]
        if body.get("stream"):
            return self._stream(calls if asks else None)
        message = {"role": "assistant", "content": None if asks else "done"}
        if asks:
            message["tool_calls"] = calls
        choice = {"index": 0, "message": message, "finish_reason": "tool_calls" if asks else "stop"}
        usage = {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12}
        self._send(
            200,
            {"id": "x", "object": "chat.completion", "created": 0, "model": "m", "choices": [choice], "usage": usage},
        )

    def _stream(self, calls: list[dict] | None) -> None:
        """As an OpenAI route streams tool calls: each call's id and name first, its arguments in later deltas."""
        base = {"id": "x", "object": "chat.completion.chunk", "created": 0, "model": "m"}
        if calls:
            deltas = [
                {"tool_calls": [{"index": i, **c, "function": {"name": c["function"]["name"], "arguments": ""}}]}
                for i, c in enumerate(calls)
            ]
            deltas += [{"tool_calls": [{"index": i, "function": {"arguments": "{}"}}]} for i in range(len(calls))]
        else:
            deltas = [{"content": "done"}]
        events = [{**base, "choices": [{"index": 0, "delta": d, "finish_reason": None}]} for d in deltas]
        events.append(
            {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls" if calls else "stop"}]}
        )
        data = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def _serve(port: int = 0) -> Fake:
    server = Fake(port)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture
def fake(monkeypatch):
    monkeypatch.setattr(_counters, "counters", Counter())  # this test's counts alone, and no warning at exit
    server = _serve()
    ac.configure(base_url=server.url)
    yield server
    ac.flush(5)
    server.shutdown()


def chat(client: openai.OpenAI, messages: list, **kwargs) -> openai.types.chat.ChatCompletion:
    return client.chat.completions.create(model="m", messages=messages, **kwargs)


def agent_of_request(fake: Fake, index: int = 0) -> str:
    bodies = [body for path, body, _ in fake.received if path.endswith("/chat/completions")]
    tags = bodies[index]["custom_params"]["agentcache"]
    return tags.get("agent_name") or tags["agent"]


@pytest.mark.parametrize("stream", [False, True])
def test_an_answer_asking_for_tools_starts_a_pause_the_agents_next_request_ends(fake, stream):
    client = openai.OpenAI(base_url=f"{fake.url}/v1", api_key="x")
    history = [SYSTEM, {"role": "user", "content": "fix the bug"}]
    with ac.workflow() as wf:
        if stream:
            calls: dict[int, str] = {}
            for chunk in chat(client, history, tools=TOOLS, stream=True):
                for call in chunk.choices[0].delta.tool_calls or () if chunk.choices else ():
                    calls.setdefault(call.index, call.id)
            ids = list(calls.values())
        else:
            ids = [call.id for call in chat(client, history, tools=TOOLS).choices[0].message.tool_calls]
        assert ac.flush(5)
        agent = agent_of_request(fake)
        assert fake.events() == [{"type": "tool_start", "workflow": wf.id, "agent": agent, "tool": "run_tests+lint"}]
        history += [
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": i, "type": "function", "function": {"name": "run_tests", "arguments": "{}"}} for i in ids
                ],
            }
        ] + [{"role": "tool", "tool_call_id": i, "content": "ok"} for i in ids]
        chat(client, history, tools=TOOLS)
        assert ac.flush(5)
        assert fake.events()[1:] == [{"type": "tool_end", "workflow": wf.id, "agent": agent, "tool": "run_tests+lint"}]
        chat(client, history, tools=TOOLS)  # no pause open: no event
    assert ac.flush(5)
    assert len(fake.events()) == 2 and ac.stats()["sent_events"] == 2
    path = fake.paths()
    assert path.index("/agentcache/v1/events") < path.index(f"/agentcache/v1/workflows/{wf.id}/end")


def test_a_workflows_end_closes_its_open_pauses_without_an_event(fake):
    client = openai.OpenAI(base_url=f"{fake.url}/v1", api_key="x")
    with ac.workflow() as wf:
        chat(client, [SYSTEM], tools=TOOLS)
    assert ac.flush(5)
    assert [e["type"] for e in fake.events()] == ["tool_start"]
    assert fake.paths()[-1] == f"/agentcache/v1/workflows/{wf.id}/end"
    assert wf.pauses == []


def test_tool_call_reports_the_apps_own_tools_and_does_nothing_outside_a_workflow(fake):
    client = openai.OpenAI(base_url=f"{fake.url}/v1", api_key="x")
    with ac.tool_call("pytest"):  # outside a workflow
        pass
    with ac.workflow() as wf:
        with ac.tool_call("pytest"):  # before any request: the server does not know this workflow
            pass
        chat(client, [SYSTEM])
        with ac.tool_call("pytest"):
            pass
        with ac.agent_name("reviewer"), ac.tool_call("search\nweb" + "x" * 300):
            pass
        assert ac.tool_started("grep", agent="coder") and ac.tool_ended("grep", agent="coder")
        assert not ac.tool_ended("grep", agent="coder"), "over already"
    assert ac.flush(5)
    agent = agent_of_request(fake)
    long_tool = ("searchweb" + "x" * 300)[:256]
    assert fake.events() == [
        {"type": "tool_start", "workflow": wf.id, "agent": agent, "tool": "pytest"},
        {"type": "tool_end", "workflow": wf.id, "agent": agent, "tool": "pytest"},
        {"type": "tool_start", "workflow": wf.id, "agent": "reviewer", "tool": long_tool},
        {"type": "tool_end", "workflow": wf.id, "agent": "reviewer", "tool": long_tool},
        {"type": "tool_start", "workflow": wf.id, "agent": "coder", "tool": "grep"},
        {"type": "tool_end", "workflow": wf.id, "agent": "coder", "tool": "grep"},
    ]
    for event in fake.events():
        tool_fields(event)  # what the server checks: each one passes


def test_a_frameworks_report_of_an_announced_call_joins_the_answers_pause(fake):
    """One pause per answer: the framework's start of a call the answer asked for sends nothing; the end of its
    last call ends the pause (earlier than the agent's next request would), and that request then ends none."""
    client = openai.OpenAI(base_url=f"{fake.url}/v1", api_key="x")
    with ac.workflow() as wf:
        first, second = chat(client, [SYSTEM], tools=TOOLS).choices[0].message.tool_calls
        # the framework runs them under another name (a tool node), by call id; and one without an id (CrewAI)
        assert not ac.tool_started("run_tests", agent="tools", call_id=first.id)
        assert not ac.tool_started("Lint the code")
        assert not ac.tool_ended("run_tests", agent="tools", call_id=first.id), "one of two calls still runs"
        assert ac.tool_ended("Lint the code")
        chat(client, [SYSTEM, {"role": "user", "content": "next"}])
    assert ac.flush(5)
    agent = agent_of_request(fake)
    assert fake.events() == [
        {"type": "tool_start", "workflow": wf.id, "agent": agent, "tool": "run_tests+lint"},
        {"type": "tool_end", "workflow": wf.id, "agent": agent, "tool": "run_tests+lint"},
    ]


def test_events_carry_the_workflows_credentials_and_reach_every_worker_behind_a_router(fake):
    workers = [_serve(), _serve()]
    fake.workers = [w.url for w in workers]
    try:
        client = openai.OpenAI(base_url=f"{fake.url}/v1", api_key="sk-tenant")
        with ac.workflow():
            chat(client, [SYSTEM], tools=TOOLS)
            chat(client, [SYSTEM, {"role": "user", "content": "again"}, {"role": "tool", "content": "ok"}], tools=TOOLS)
        assert ac.flush(5)
        for worker in workers:
            assert [e["type"] for e in worker.events()] == ["tool_start", "tool_end"]
            assert {h["authorization"] for p, _, h in worker.received} == {"Bearer sk-tenant"}
        assert fake.events() == [], "the router has no events route"
    finally:
        for worker in workers:
            worker.shutdown()


def test_events_go_in_batches_of_at_most_256_in_order_and_never_block_the_app(fake):
    fake.events_delay = 0.3  # the first batch is slow: the rest pile up behind it
    event = {"type": "tool_start", "workflow": "w", "agent": "a", "tool": "t"}
    started = time.monotonic()
    for i in range(700):
        _events.sender.submit_event({**event, "tool": f"t{i}"}, {})
    assert time.monotonic() - started < 0.5, "queued, not sent, on the app's thread"
    assert ac.flush(10)
    batches = fake.batches()
    assert all(1 <= len(batch) <= 256 for batch in batches) and len(batches) <= 5
    assert max(len(batch) for batch in batches) == 256
    assert [e["tool"] for e in fake.events()] == [f"t{i}" for i in range(700)]
    assert ac.stats()["sent_events"] == 700 and ac.stats()["pending_events"] == 0


def test_ends_and_events_keep_their_order_and_credentials_split_batches(fake):
    event = {"type": "tool_start", "workflow": "w", "agent": "a", "tool": "t"}
    fake.events_delay = 0.2
    _events.sender.submit_event(event, {})  # holds the thread while the rest queue up
    time.sleep(0.05)
    _events.sender.submit_event({**event, "tool": "1"}, {})
    _events.sender.submit_event({**event, "tool": "2"}, {"Authorization": "Bearer other"})
    _events.sender.submit_end("w", {})
    _events.sender.submit_event({**event, "tool": "3"}, {})
    assert ac.flush(5)
    sent = [(p, [e["tool"] for e in b.get("events", [])]) for p, b, _ in fake.received]
    assert sent == [
        ("/agentcache/v1/events", ["t"]),
        ("/agentcache/v1/events", ["1"]),
        ("/agentcache/v1/events", ["2"]),
        ("/agentcache/v1/workflows/w/end", []),
        ("/agentcache/v1/events", ["3"]),
    ]


def test_a_server_away_costs_the_app_nothing_events_are_dropped_and_counted(fake, monkeypatch):
    monkeypatch.setattr(_events, "UNREACHABLE_COOLDOWN_S", 0.5)
    ac.configure(base_url=f"http://127.0.0.1:{free_port()}")  # nobody listens
    event = {"type": "tool_start", "workflow": "w", "agent": "a", "tool": "t"}
    started = time.monotonic()
    for _ in range(50):
        _events.sender.submit_event(event, {})
    assert ac.flush(5) and time.monotonic() - started < 2, "no retries for a refused connection"
    stats = ac.stats()
    assert stats["dropped_events"] == 50 and stats["sent_events"] == 0 and stats["unreachable"] >= 1

    monkeypatch.setattr(_events, "MAX_PENDING", 0)  # the bound: what does not fit is dropped, not queued
    ac.configure(base_url=fake.url)
    time.sleep(0.6)
    _events.sender.submit_event(event, {})
    assert ac.stats()["dropped_events"] == 51 and _events.sender.pending() == 0


def test_a_hung_server_holds_up_neither_the_app_nor_the_exit_wait(fake, monkeypatch):
    black_hole = __import__("socket").socket()  # accepts connections and never answers
    black_hole.bind(("127.0.0.1", 0))
    black_hole.listen(64)
    monkeypatch.setattr(_config.settings, "end_timeout_s", 0.3)
    try:
        fake.workers = [f"http://127.0.0.1:{black_hole.getsockname()[1]}"]  # a hung worker behind the router
        event = {"type": "tool_start", "workflow": "w", "agent": "a", "tool": "t"}
        started = time.monotonic()
        for _ in range(300):
            _events.sender.submit_event(event, {})
        assert time.monotonic() - started < 0.5
        assert ac.flush(5) and time.monotonic() - started < 2.5, "one timed-out batch trips the breaker"
        assert ac.stats()["dropped_events"] == 300
    finally:
        black_hole.close()


def test_a_refused_batch_is_counted_and_not_retried(fake):
    fake.events_status = 400
    event = {"type": "tool_start", "workflow": "w", "agent": "a", "tool": "t"}
    for _ in range(3):
        _events.sender.submit_event(event, {})
    assert ac.flush(5)
    assert ac.stats()["refused_events"] == 3 and len(fake.batches()) <= 3
    fake.events_status = 429  # over the server's event rate: shed
    _events.sender.submit_event(event, {})
    assert ac.flush(5)
    assert ac.stats()["dropped_events"] == 1 and ac.stats()["refused_events"] == 3


def test_tool_events_off_sends_none_and_a_recording_still_holds_them(fake, tmp_path, monkeypatch):
    monkeypatch.setattr(_config.settings, "tool_events", False)
    client = openai.OpenAI(base_url=f"{fake.url}/v1", api_key="x")
    path = tmp_path / "rec.jsonl"
    with ac.record(path):
        with ac.workflow() as wf:
            chat(client, [SYSTEM], tools=TOOLS)
            chat(client, [SYSTEM, {"role": "tool", "content": "results"}], tools=TOOLS)
        assert ac.flush(5)
    assert fake.events() == []
    trace = read_trace(path)
    kinds = [type(e).__name__ for e in trace.events]
    assert kinds == ["Request", "ToolStart", "ToolEnd", "Request", "End"]
    start, end = (e for e in trace.events if isinstance(e, ToolStart | ToolEnd))
    assert start.workflow == end.workflow == wf.id and start.tool == end.tool == "run_tests+lint"
    assert start.agent == trace.requests[0].agent, "the agent the requests are recorded under"
    assert start.ts <= end.ts


def test_the_setting_is_read_from_the_environment():
    assert _config._switch("X_UNSET_FOR_TEST", True) is True
    with pytest.MonkeyPatch.context() as m:
        for text, value in (("off", False), ("0", False), ("yes", True)):
            m.setenv("AGENTCACHE_TOOL_EVENTS_T", text)
            assert _config._switch("AGENTCACHE_TOOL_EVENTS_T", True) is value
        m.setenv("AGENTCACHE_TOOL_EVENTS_T", "maybe")
        with pytest.raises(ValueError, match="AGENTCACHE_TOOL_EVENTS_T"):
            _config._switch("AGENTCACHE_TOOL_EVENTS_T", True)


def test_a_plain_httpx_app_gets_pauses_too(fake):
    with ac.workflow() as wf, httpx.Client() as client:
        body = {"model": "m", "messages": [SYSTEM], "tools": TOOLS}
        client.post(f"{fake.url}/v1/chat/completions", json=body).raise_for_status()
        body["messages"] = [SYSTEM, {"role": "tool", "content": "results"}]
        client.post(f"{fake.url}/v1/chat/completions", json=body)
    assert ac.flush(5)
    assert [(e["type"], e["workflow"]) for e in fake.events()] == [("tool_start", wf.id), ("tool_end", wf.id)]


LANGGRAPH_APP = """
import asyncio, json, sys
import agentcache_sdk as ac
from langchain_core.messages import HumanMessage, SystemMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from agentcache.integrations.langgraph import workflow


@tool
def run_tests() -> str:
    '''Run the tests.'''
    return "4 passed"


@tool
def lint() -> str:
    '''Lint the code.'''
    return "clean"


ac.configure(base_url=sys.argv[1])
llm = ChatOpenAI(base_url=sys.argv[1] + "/v1", api_key="x", model="m").bind_tools([run_tests, lint])


async def agent(state):
    return {"messages": [await llm.ainvoke(state["messages"])]}


graph = StateGraph(MessagesState)
graph.add_node("agent", agent)
graph.add_node("tools", ToolNode([run_tests, lint]))
graph.add_edge(START, "agent")
graph.add_conditional_edges("agent", tools_condition)
graph.add_edge("tools", "agent")
app = graph.compile()


@workflow
async def solve():
    await app.ainvoke({"messages": [SystemMessage("You are the coder."), HumanMessage("fix it")]})
    return ac.current_workflow().id


print(json.dumps({"workflow": asyncio.run(solve())}))
"""

AUTOGEN_APP = """
import asyncio, json, sys
import agentcache_sdk as ac
from autogen_agentchat.agents import AssistantAgent
from autogen_core.models import ModelFamily, ModelInfo
from autogen_ext.models.openai import OpenAIChatCompletionClient
from agentcache.integrations.autogen import workflow


async def run_tests() -> str:
    '''Run the tests.'''
    return "4 passed"


async def lint() -> str:
    '''Lint the code.'''
    return "clean"


ac.configure(base_url=sys.argv[1])
info = ModelInfo(vision=False, function_calling=True, json_output=False, family=ModelFamily.UNKNOWN,
                 structured_output=False)
client = OpenAIChatCompletionClient(model="m", base_url=sys.argv[1] + "/v1", api_key="x", model_info=info)
coder = AssistantAgent("coder", model_client=client, tools=[run_tests, lint], reflect_on_tool_use=True)


@workflow
async def solve():
    await coder.run(task="fix it")
    return ac.current_workflow().id


print(json.dumps({"workflow": asyncio.run(solve())}))
"""


@pytest.mark.frameworks
@pytest.mark.parametrize("app", [LANGGRAPH_APP, AUTOGEN_APP], ids=["langgraph", "autogen"])
def test_a_framework_running_the_tools_an_answer_asked_for_makes_one_pause_of_them(fake, app):
    """The answer asks for two tools (a pause starts); the framework runs them and reports each by call id (they
    join that pause, which ends when both returned); the agent's next call then ends nothing more."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", app, fake.url], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    workflow = json.loads(done.stdout.strip().splitlines()[-1])["workflow"]
    agent = agent_of_request(fake)  # LangGraph's node name; AutoGen's agent outside a team: its fingerprint
    assert [e for e in fake.events() if e["type"].startswith("tool_")] == [
        {"type": "tool_start", "workflow": workflow, "agent": agent, "tool": "run_tests+lint"},
        {"type": "tool_end", "workflow": workflow, "agent": agent, "tool": "run_tests+lint"},
    ]
    chats = [p for p in fake.paths() if p.endswith("/chat/completions")]
    assert len(chats) == 2 and fake.paths().index("/agentcache/v1/events") < len(fake.paths()) - 1


EXIT_SCRIPT = """
import json, sys, time
import agentcache_sdk as ac
from agentcache_sdk import _events

ac.configure(base_url=sys.argv[1], exit_timeout_s=0.5)
for i in range(500):
    _events.sender.submit_event({"type": "tool_start", "workflow": "w", "agent": "a", "tool": f"t{i}"}, {})
print(json.dumps({"done_at": time.time()}), flush=True)
"""


def test_events_the_server_never_took_hold_up_the_exit_no_longer_than_its_wait_and_are_reported(fake):
    import socket
    import subprocess
    import sys

    black_hole = socket.socket()  # a worker that accepts connections and never answers
    black_hole.bind(("127.0.0.1", 0))
    black_hole.listen(64)
    fake.workers = [f"http://127.0.0.1:{black_hole.getsockname()[1]}"]
    try:
        done = subprocess.run([sys.executable, "-c", EXIT_SCRIPT, fake.url], capture_output=True, text=True, timeout=60)
    finally:
        black_hole.close()
    exited = time.time()
    assert done.returncode == 0, done.stderr[-3000:]
    assert exited - json.loads(done.stdout.strip().splitlines()[-1])["done_at"] < 1.5
    assert "agentcache: 500 events (tool calls, plans, decisions) were dropped" in done.stderr, done.stderr[-3000:]
