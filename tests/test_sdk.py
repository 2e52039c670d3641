"""The SDK against a small local HTTP server that records what it receives (the real server is in the e2e tests)."""

from __future__ import annotations

import asyncio
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import openai
import pytest

import agentcache_sdk as ac
from agentcache.trace import read_trace
from agentcache_sdk._tags import agent_of


class Recording(ThreadingHTTPServer):
    def __init__(self):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.requests: list[tuple[str, dict, dict]] = []
        self.down = False

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):  # noqa: ANN002
        pass

    def do_POST(self):  # noqa: N802
        server: Recording = self.server  # type: ignore[assignment]
        body = json.loads(self.rfile.read(int(self.headers["content-length"])) or b"{}")
        server.requests.append((self.path, body, {k.lower(): v for k, v in self.headers.items()}))
        if server.down:
            self.send_response(503)
            self.end_headers()
            return
        if self.path.endswith("/end"):
            payload = {"workflow": self.path.split("/")[-2], "ended": True}
        else:
            payload = {
                "id": "x",
                "object": "chat.completion",
                "created": 0,
                "model": "m",
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": "reply to " + str(len(body.get("messages", [])))},
                        "finish_reason": "stop",
                    }
                ],
                "usage": {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12},
            }
        data = json.dumps(payload).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def fake():
    server = Recording()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    ac.configure(base_url=server.url)
    yield server
    ac.flush(5)
    server.shutdown()


def chats(server):
    return [(b, h) for p, b, h in server.requests if p.endswith("/chat/completions")]


def ends(server):
    ac.flush(5)
    return [p.split("/")[-2] for p, _, _ in server.requests if p.endswith("/end")]


SYSTEM = {"role": "system", "content": "You are the coder."}


def test_requests_inside_a_workflow_are_tagged_outside_are_not(fake):
    client = openai.OpenAI(base_url=f"{fake.url}/v1", api_key="x")
    client.chat.completions.create(model="m", messages=[SYSTEM, {"role": "user", "content": "hi"}])

    @ac.workflow(name="demo")
    def run():
        with ac.agent_name("coder"):
            client.chat.completions.create(model="m", messages=[SYSTEM, {"role": "user", "content": "hi"}])
        return ac.current_workflow().id

    wid = run()
    (outside, _), (inside, headers) = chats(fake)
    assert "custom_params" not in outside
    tags = inside["custom_params"]["agentcache"]
    assert tags == {"v": 1, "workflow": wid, "agent": agent_of([SYSTEM])[0], "fixed_messages": 1, "agent_name": "coder"}
    assert headers["x-smg-routing-key"] == wid and json.loads(headers["x-request-id-agentcache"]) == tags
    assert ends(fake) == [wid]
    assert ac.current_workflow() is None


def test_agent_id_rule():
    tools = [{"type": "function", "function": {"name": "f"}}]
    a1, n1 = agent_of([SYSTEM, {"role": "developer", "content": "d"}, {"role": "user", "content": "u1"}])
    a2, n2 = agent_of([SYSTEM, {"role": "developer", "content": "d"}, {"role": "user", "content": "other"}])
    assert a1 == a2 and n1 == n2 == 2, "same fixed messages: same agent, whatever follows"
    assert agent_of([SYSTEM], tools)[0] != agent_of([SYSTEM])[0], "tool schemas are part of the fixed prefix"
    selector = "You are in a role play game. The following roles are available: planner, coder." * 5
    s1, f1 = agent_of([{"role": "user", "content": selector + " history A"}])
    s2, _ = agent_of([{"role": "user", "content": selector + " a much longer history B"}])
    assert s1 == s2 and f1 == 0, "no system message: the first characters identify the agent, no fixed message"


def test_each_call_is_one_workflow_ended_once_even_on_exceptions(fake):
    client = openai.OpenAI(base_url=f"{fake.url}/v1", api_key="x")

    @ac.workflow
    def failing():
        client.chat.completions.create(model="m", messages=[SYSTEM])
        ac.end_workflow()  # explicit end; the exit must not send a second one
        raise ValueError("app bug")

    for _ in range(2):
        with pytest.raises(ValueError):
            failing()
    ids = [b["custom_params"]["agentcache"]["workflow"] for b, _ in chats(fake)]
    assert len(set(ids)) == 2
    assert sorted(ends(fake)) == sorted(ids)


def test_nested_workflows_join_the_outer_one_and_context_manager_works(fake):
    client = openai.OpenAI(base_url=f"{fake.url}/v1", api_key="x")

    @ac.workflow
    def inner():
        client.chat.completions.create(model="m", messages=[SYSTEM])

    with ac.workflow(name="outer") as wf:
        inner()
        inner()
    ids = {b["custom_params"]["agentcache"]["workflow"] for b, _ in chats(fake)}
    assert ids == {wf.id} and ends(fake) == [wf.id]


def test_async_workflows_run_concurrently_with_their_own_ids(fake):
    client = openai.AsyncOpenAI(base_url=f"{fake.url}/v1", api_key="x")

    @ac.workflow
    async def run(i):
        for _ in range(3):
            await client.chat.completions.create(model="m", messages=[SYSTEM, {"role": "user", "content": str(i)}])
            await asyncio.sleep(0.01)
        return ac.current_workflow().id

    async def main():
        return await asyncio.gather(*(run(i) for i in range(5)))

    ids = asyncio.run(main())
    seen = {}
    for body, _ in chats(fake):
        user = body["messages"][1]["content"]
        seen.setdefault(user, set()).add(body["custom_params"]["agentcache"]["workflow"])
    assert all(len(v) == 1 for v in seen.values()) and {next(iter(v)) for v in seen.values()} == set(ids)
    assert sorted(ends(fake)) == sorted(ids)


def test_plain_httpx_clients_are_tagged_too(fake):
    with ac.workflow() as wf, httpx.Client() as client:
        client.post(f"{fake.url}/v1/chat/completions", json={"model": "m", "messages": [SYSTEM]})
        client.post(f"{fake.url}/generate", json={"text": "hello", "sampling_params": {"max_new_tokens": 1}})
    ((chat, _),) = chats(fake)
    assert chat["custom_params"]["agentcache"]["workflow"] == wf.id
    generate = next(b for p, b, _ in fake.requests if p == "/generate")
    assert generate["sampling_params"]["custom_params"]["agentcache"]["workflow"] == wf.id
    assert generate["sampling_params"]["max_new_tokens"] == 1


def test_requests_to_other_servers_are_never_touched(fake):
    other = Recording()
    threading.Thread(target=other.serve_forever, daemon=True).start()
    try:
        client = openai.OpenAI(base_url=f"{other.url}/v1", api_key="x")
        with ac.workflow():
            client.chat.completions.create(model="m", messages=[SYSTEM])
        ((body, headers),) = chats(other)
        assert "custom_params" not in body and "x-smg-routing-key" not in headers
    finally:
        other.shutdown()


def test_an_unreachable_server_never_breaks_the_app(fake, caplog):
    fake.down = True
    before = ac.counters["end_failures"]
    for _ in range(2):
        with ac.workflow():
            pass
    assert ac.flush(30)
    assert ac.counters["end_failures"] == before + 2
    fake.down = False


def test_recorder_writes_a_replayable_trace(fake, tmp_path):
    client = openai.OpenAI(base_url=f"{fake.url}/v1", api_key="x")
    path = tmp_path / "rec.jsonl"
    with ac.record(path) as recorder:
        for _ in range(2):
            with ac.workflow():
                history = [SYSTEM, {"role": "user", "content": "task"}]
                for _ in range(3):
                    reply = client.chat.completions.create(model="m", messages=history).choices[0].message.content
                    history.append({"role": "assistant", "content": reply})
        ac.flush(5)
    trace = read_trace(path)  # valid trace format v1
    requests = trace.requests
    assert recorder.requests == len(requests) == 6 and len(trace.ended_workflows) == 2
    first, second = requests[0], requests[1]
    assert first.fixed == 1 and second.segments[: len(first.segments)] == first.segments
    assert second.segments[len(first.segments)].content_id == first.output_id, "the reply comes back as the output"
