"""The SDK against a small local HTTP server that records what it receives (the real server is in the e2e tests)."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import openai
import pytest

import agentcache_sdk as ac
from agentcache.server_ext.launcher import free_port
from agentcache.tags import agent_of
from agentcache.trace import read_trace
from agentcache_sdk import _config, _counters, _events, _workflow


class Recording(ThreadingHTTPServer):
    def __init__(self, port: int = 0):
        super().__init__(("127.0.0.1", port), _Handler)
        self.requests: list[tuple[str, dict, dict]] = []
        self.down = False
        self.workers: list[str] | None = None  # set: answers `GET /workers` like sglang-router with these workers
        self.listings = 0  # `GET /workers` asked
        # an int: `GET /workers` answers that status; a float: it hangs that many seconds
        self.listing_fault: int | float | None = None
        self.cached_tokens: int | None = None  # set: answers report this many cached prompt tokens
        self.end_delay = 0.0  # seconds it takes to answer an end event

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):  # noqa: ANN002
        pass

    def do_GET(self):  # noqa: N802
        server: Recording = self.server  # type: ignore[assignment]
        if self.path == "/workers":
            server.listings += 1
            fault = server.listing_fault
            if isinstance(fault, float):
                time.sleep(fault)
            elif fault is not None:
                self.send_response(fault)
                self.end_headers()
                return
        if self.path != "/workers" or server.workers is None:
            self.send_response(404)
            self.end_headers()
            return
        workers = [{"url": url, "is_healthy": True} for url in server.workers]
        data = json.dumps({"workers": workers, "total": len(workers), "stats": {}}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self):  # noqa: N802
        server: Recording = self.server  # type: ignore[assignment]
        body = json.loads(self.rfile.read(int(self.headers["content-length"])) or b"{}")
        server.requests.append((self.path, body, {k.lower(): v for k, v in self.headers.items()}))
        if self.path.endswith("/end") and server.end_delay:
            time.sleep(server.end_delay)
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
            if server.cached_tokens is not None:
                payload["usage"]["prompt_tokens_details"] = {"cached_tokens": server.cached_tokens}
            if body.get("stream"):
                self._stream(payload, (body.get("stream_options") or {}).get("include_usage", False))
                return
        data = json.dumps(payload).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _stream(self, payload: dict, include_usage: bool) -> None:
        """Answer as an OpenAI route streams: one event per word, the usage last where asked, then [DONE]; the
        bytes split across writes anywhere, as a network may."""
        words = payload["choices"][0]["message"]["content"].split(" ")
        events = [
            {
                "object": "chat.completion.chunk",
                "choices": [{"index": 0, "delta": {"content": w if not i else " " + w}}],
            }
            for i, w in enumerate(words)
        ]
        if include_usage:
            events.append({"object": "chat.completion.chunk", "choices": [], "usage": payload["usage"]})
        data = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        for start in range(0, len(data), 7):
            self.wfile.write(data[start : start + 7])
            self.wfile.flush()


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
    assert tags == {
        "v": 1, "workflow": wid, "agent": agent_of([SYSTEM])[0], "fixed_messages": 1, "agent_name": "coder", "app": "demo"
    }  # fmt: skip
    assert headers["x-smg-routing-key"] == wid and json.loads(headers["x-request-id-agentcache"]) == tags
    assert ends(fake) == [wid]
    assert ac.current_workflow() is None


def test_a_workflow_named_in_any_script_is_tagged_routed_and_ended(fake):
    """A header value must be ASCII (httpx refuses to send one that is not): a workflow named in Chinese or
    Cyrillic made every LLM call inside it fail. Its routing key is its id percent-encoded; the tags carry the id
    as written (JSON), and its end event reaches the server."""
    from urllib.parse import quote

    client = openai.OpenAI(base_url=f"{fake.url}/v1", api_key="x")
    ids = []
    with ac.workflow(name="研究"):  # the SDK makes the id: the name, then a random part
        client.chat.completions.create(model="m", messages=[SYSTEM, {"role": "user", "content": "hi"}])
        ids.append(ac.current_workflow().id)
    with ac.workflow(workflow_id="задача-7"), httpx.Client() as plain:  # not through the openai SDK
        plain.post(f"{fake.url}/v1/chat/completions", json={"model": "m", "messages": [SYSTEM]}).raise_for_status()
        ids.append(ac.current_workflow().id)
    assert ids[0].startswith("研究-") and ids[1] == "задача-7"
    for (body, headers), wid in zip(chats(fake), ids, strict=True):
        assert body["custom_params"]["agentcache"]["workflow"] == wid
        assert headers["x-smg-routing-key"] == quote(wid, safe="")
    assert ends(fake) == [quote(wid, safe="") for wid in ids]


def test_ids_the_server_would_refuse_are_refused_where_they_are_made_and_ids_the_sdk_makes_stay_valid(fake):
    """A workflow id with a line break cannot travel in a header, and one the wire format refuses (too long,
    control characters) would get every request served untagged: the decorator says so at once. Ids the SDK
    makes itself (a long name's, the next workflow's after an end) and agent names stay valid tags."""
    from agentcache.tags import parse

    for bad in ({"workflow_id": "run\n7"}, {"workflow_id": "x" * 257}, {"name": "batch\tjob"}):
        with pytest.raises(ValueError, match="workflow_id|name"):
            ac.workflow(**bad)
    client = openai.OpenAI(base_url=f"{fake.url}/v1", api_key="x")
    for scope in (ac.workflow(workflow_id="y" * 256), ac.workflow(name="n" * 250)):
        with scope, ac.agent_name("coder\x00"):
            client.chat.completions.create(model="m", messages=[SYSTEM, {"role": "user", "content": "hi"}])
            ac.end_workflow()
            client.chat.completions.create(model="m", messages=[SYSTEM, {"role": "user", "content": "again"}])
    sent = [parse(body["custom_params"]["agentcache"]) for body, _ in chats(fake)]  # the server's one parser
    assert [t.agent_name for t in sent] == ["coder"] * 4
    assert sent[1].workflow.endswith(".2") and sent[1].workflow[:-2] == sent[0].workflow[:-2]


def test_a_request_whose_custom_params_are_not_an_object_goes_as_written(fake):
    """The SDK adds its tags to the app's custom_params; where the app put something else there (a string, a
    number), merging raised inside the app's call. Such a request goes as the app wrote it, untagged: the
    server answers it as it would have."""
    client = openai.OpenAI(base_url=f"{fake.url}/v1", api_key="x")
    with ac.workflow(), httpx.Client() as plain:
        client.chat.completions.create(model="m", messages=[SYSTEM], extra_body={"custom_params": "mine"})
        plain.post(
            f"{fake.url}/v1/chat/completions", json={"messages": [SYSTEM], "custom_params": 7}
        ).raise_for_status()
        plain.post(f"{fake.url}/generate", json={"text": "hi", "sampling_params": 5}).raise_for_status()
        plain.post(f"{fake.url}/generate", json={"text": "hi", "sampling_params": {"custom_params": []}})
    sent = [(path, body) for path, body, _ in fake.requests if not path.endswith("/end")]
    assert sent == [
        ("/v1/chat/completions", {"model": "m", "messages": [SYSTEM], "custom_params": "mine"}),
        ("/v1/chat/completions", {"messages": [SYSTEM], "custom_params": 7}),
        ("/generate", {"text": "hi", "sampling_params": 5}),
        ("/generate", {"text": "hi", "sampling_params": {"custom_params": []}}),
    ]


def test_an_agent_name_that_is_not_text_is_no_name_not_a_failed_request(fake):
    client = openai.OpenAI(base_url=f"{fake.url}/v1", api_key="x")
    ac.add_agent_name_provider(lambda: 42)  # an integration's slip
    try:
        with ac.workflow(), ac.agent_name(7):  # type: ignore[arg-type]
            client.chat.completions.create(model="m", messages=[SYSTEM, {"role": "user", "content": "hi"}])
    finally:
        _workflow._name_providers.pop()
    ((body, _),) = chats(fake)
    assert "agent_name" not in body["custom_params"]["agentcache"]


def test_a_fault_in_tagging_sends_the_request_as_the_app_wrote_it_and_is_counted(fake, monkeypatch):
    """Whatever goes wrong inside the SDK's tagging, the app's request goes out untouched (a bug of ours once
    raised inside the app's call, for non-ASCII workflow ids); the failure is counted and said once."""
    from agentcache_sdk import _tagging

    def broken(path, body):
        raise RuntimeError("a bug in tagging")

    monkeypatch.setattr(_tagging, "tags_for", broken)
    before = ac.stats()["tagging_failures"]
    client = openai.OpenAI(base_url=f"{fake.url}/v1", api_key="x")
    with ac.workflow(), httpx.Client() as plain:
        client.chat.completions.create(model="m", messages=[SYSTEM, {"role": "user", "content": "hi"}])
        plain.post(f"{fake.url}/v1/chat/completions", json={"model": "m", "messages": [SYSTEM]}).raise_for_status()
    assert [body for body, _ in chats(fake)] == [
        {"model": "m", "messages": [SYSTEM, {"role": "user", "content": "hi"}]},
        {"model": "m", "messages": [SYSTEM]},
    ]
    assert all("x-smg-routing-key" not in headers for _, headers in chats(fake))
    assert ac.stats()["tagging_failures"] > before


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


def _workers_behind(fake, n: int = 2) -> list[Recording]:
    """Make `fake` answer like sglang-router in front of `n` fake workers (which record the end events)."""
    workers = [Recording() for _ in range(n)]
    for worker in workers:
        threading.Thread(target=worker.serve_forever, daemon=True).start()
    fake.workers = [w.url for w in workers]
    return workers


AGENTS = {name: {"role": "system", "content": f"You are the {name}. " * 40} for name in ("planner", "coder", "tester")}


def test_behind_a_cluster_each_request_carries_the_slot_the_workflow_aware_routing_chose(fake, monkeypatch):
    from agentcache.routing import WorkflowAwareRouting

    chosen: list[int] = []
    choose = WorkflowAwareRouting.choose

    def spy(self, *args, **kwargs):
        placement = choose(self, *args, **kwargs)
        chosen.append(placement.slot)
        return placement

    monkeypatch.setattr(WorkflowAwareRouting, "choose", spy)
    workers = _workers_behind(fake)
    fake.cached_tokens = 4
    client = openai.OpenAI(base_url=f"{fake.url}/v1", api_key="x", max_retries=0)

    @ac.workflow
    def solve(task):
        for system in AGENTS.values():
            messages = [system, {"role": "user", "content": task}]
            for _ in range(2):
                client.chat.completions.create(model="m", messages=messages)
                messages += [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "go on"}]
        return ac.current_workflow().id

    try:
        ids = [solve(f"task {i}") for i in range(4)]
        keys = [headers["x-smg-routing-key"] for _, headers in chats(fake)]
        assert keys == [f"agentcache-worker-{slot}" for slot in chosen] and len(keys) == 24, "the routing's choice"
        assert set(keys) == {"agentcache-worker-0", "agentcache-worker-1"}, "both slots, never a workflow id"
        stats = ac.routing_stats()
        assert stats["workers"] == 2 and stats["chars_per_token"] != 4.0, "calibrated on the answers' prompt tokens"
        expected = stats["agent_expected_output_tokens"]
        assert len(expected) == len(AGENTS) and set(expected.values()) == {2}, "learned from the answers' usage"
        for slot in stats["slots"]:
            assert slot["requests"] == slot["answered"] == keys.count(slot["key"]) and slot["in_flight"] == 0
            assert slot["prompt_tokens"] == 10 * slot["requests"] and slot["cached_tokens"] == 4 * slot["requests"]
        for worker in workers:  # the router has no end route: each end goes to every worker it lists
            assert sorted(ends(worker)) == sorted(ids)
        assert ends(fake) == []
        from agentcache_sdk._routing import _routers

        assert _routers[fake.url].routing._workflow_slots == {}, "ended workflows are forgotten"
    finally:
        for worker in workers:
            worker.shutdown()


@pytest.mark.parametrize("fault", [503, 3.0], ids=["answering-503", "hanging"])
def test_a_server_whose_worker_listing_fails_costs_one_short_lookup_not_one_per_request(fake, monkeypatch, fault):
    """The request hooks ask `GET /workers` whether the server is a cluster. Where that fails (a server in trouble
    answering 5xx, or one that hangs), each request used to ask again, waiting up to 5 s each time (in an async
    app, with its event loop blocked) and doubling the load on the server; now the first waits at most
    REQUEST_LOOKUP_TIMEOUT, the requests go keyed by their workflow, and the lookup is retried in the background
    FAILED_RETRY_S later: a router that answers then is found."""
    from agentcache_sdk import _workers
    from agentcache_sdk._tagging import routing_key

    fake.listing_fault = fault
    client = openai.OpenAI(base_url=f"{fake.url}/v1", api_key="x", max_retries=0)
    with ac.workflow() as wf:
        started = time.monotonic()
        for _ in range(4):
            client.chat.completions.create(model="m", messages=[SYSTEM, {"role": "user", "content": "hi"}])
        assert time.monotonic() - started < 2.5, "one lookup of at most REQUEST_LOOKUP_TIMEOUT, not one per request"
    assert ends(fake) == [wf.id], "the end goes to the server itself at once, not after another lookup"
    assert fake.listings == 1
    assert {h["x-smg-routing-key"] for _, h in chats(fake)} == {routing_key(wf.id)}, "keyed by the workflow"

    monkeypatch.setattr(_workers, "FAILED_RETRY_S", 0.0)
    workers = _workers_behind(fake)
    fake.listing_fault = None
    try:
        deadline = time.monotonic() + 10
        while _workers.cluster_size(fake.url, {}) != 2:  # retried in the background, not waited for
            assert time.monotonic() < deadline, "the router was never found"
            time.sleep(0.05)
        with ac.workflow() as routed:
            client.chat.completions.create(model="m", messages=[SYSTEM, {"role": "user", "content": "hi"}])
        assert chats(fake)[-1][1]["x-smg-routing-key"].startswith("agentcache-worker-")
        assert [ends(worker) for worker in workers] == [[routed.id]] * 2, "its end goes to every worker"
    finally:
        for worker in workers:
            worker.shutdown()


def test_every_routed_request_is_handed_back_even_when_it_fails(fake):
    workers = _workers_behind(fake)
    chat = {"model": "m", "messages": [SYSTEM, {"role": "user", "content": "hi"}]}

    def refuse(request):
        raise httpx.ConnectError("refused", request=request)

    try:
        with ac.workflow(), httpx.Client() as client:
            client.post(f"{fake.url}/v1/chat/completions", json={**chat, "stream": True})  # not read as JSON
            with client.stream("POST", f"{fake.url}/v1/chat/completions", json=chat) as response:
                next(response.iter_bytes())  # closed before the end
            fake.down = True
            assert client.post(f"{fake.url}/v1/chat/completions", json=chat).status_code == 503
        with ac.workflow(), httpx.Client(transport=httpx.MockTransport(refuse)) as client:
            with pytest.raises(httpx.ConnectError):
                client.post(f"{fake.url}/v1/chat/completions", json=chat)
        slots = ac.routing_stats()["slots"]
        assert sum(s["requests"] for s in slots) == sum(s["answered"] for s in slots) == 4
        assert all(s["in_flight"] == 0 for s in slots), slots
    finally:
        fake.down = False
        ac.flush(5)
        for worker in workers:
            worker.shutdown()


def test_workflow_affinity_is_a_setting_and_unknown_routings_are_refused(fake, monkeypatch):

    monkeypatch.setattr(ac.settings, "routing", ac.settings.routing)  # restored afterwards
    workers = _workers_behind(fake)
    try:
        ac.configure(routing="workflow-affinity")
        with ac.workflow() as wf, httpx.Client() as client:
            client.post(f"{fake.url}/v1/chat/completions", json={"model": "m", "messages": [SYSTEM]})
        ((_, headers),) = chats(fake)
        assert headers["x-smg-routing-key"] == wf.id, "the workflow id, as before"
        assert ac.routing_stats() is None
    finally:
        ac.flush(5)
        for worker in workers:
            worker.shutdown()
    with pytest.raises(
        ValueError, match="routing: unknown routing 'round-robin'; choose from workflow-aware, workflow-affinity"
    ):
        ac.configure(routing="round-robin")
    assert ac.settings.routing == "workflow-affinity"
    monkeypatch.setenv("AGENTCACHE_ROUTING", "sticky")
    with pytest.raises(ValueError, match="AGENTCACHE_ROUTING: unknown routing 'sticky'"):
        _config._from_env()
    monkeypatch.setenv("AGENTCACHE_ROUTING", "workflow-affinity")
    assert _config._from_env().routing == "workflow-affinity"
    monkeypatch.delenv("AGENTCACHE_ROUTING")
    assert _config._from_env().routing == "workflow-aware", "the default"
    monkeypatch.setenv("AGENTCACHE_EXIT_TIMEOUT_S", "2s")  # a typo names its variable, not just "float()"
    with pytest.raises(ValueError, match="AGENTCACHE_EXIT_TIMEOUT_S: expected a number of seconds >= 0, got '2s'"):
        _config._from_env()
    monkeypatch.setenv("AGENTCACHE_EXIT_TIMEOUT_S", "0.5")
    assert _config._from_env().exit_timeout_s == 0.5


def test_an_unreachable_server_never_breaks_the_app(fake, caplog):
    fake.down = True
    before = ac.counters["end_failures"]
    for _ in range(2):
        with ac.workflow(), httpx.Client() as client:
            client.post(f"{fake.url}/v1/chat/completions", json={"model": "m", "messages": [SYSTEM]})
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


def test_a_recorder_that_fails_loses_its_events_not_the_apps_requests(fake, tmp_path):
    """The recorder writes as events happen; a full disk there raised inside the app's LLM call and out of its
    workflow. The app goes on; the failures are counted. An answer of an odd shape is recorded, not fatal."""
    from agentcache.tags import Tags

    client = openai.OpenAI(base_url=f"{fake.url}/v1", api_key="x")
    before = ac.stats()["observer_failures"]
    with ac.record(tmp_path / "full.jsonl") as recorder:

        def disk_full(event):  # noqa: ANN001
            raise OSError(28, "No space left on device")

        recorder._write = disk_full
        with ac.workflow():
            reply = client.chat.completions.create(model="m", messages=[SYSTEM]).choices[0].message.content
    assert reply == "reply to 1"
    assert ac.stats()["observer_failures"] == before + 2  # the request and the workflow's end

    path = tmp_path / "odd.jsonl"
    with ac.record(path) as recorder:
        tags = Tags(workflow="w", agent="a:1", fixed_messages=1)
        recorder.on_request(0.0, {"messages": [SYSTEM]}, {"choices": ["not an object"]}, tags)
    (request,) = read_trace(path).requests
    assert request.output == 1 and request.output_id is None


def test_recorder_and_usage_read_streamed_answers_too(fake, tmp_path):
    """Agent apps stream (the demo does, LangGraph can): a streamed answer is recorded with its reply and
    its usage counted, from the sync and the async openai client alike."""
    fake.cached_tokens = 4
    sync_client = openai.OpenAI(base_url=f"{fake.url}/v1", api_key="x")
    async_client = openai.AsyncOpenAI(base_url=f"{fake.url}/v1", api_key="x")
    chat = {"model": "m", "stream": True, "stream_options": {"include_usage": True}}

    def reply_of(stream) -> str:  # noqa: ANN001
        return "".join(c.choices[0].delta.content or "" for c in stream if c.choices)

    async def streamed_async(history: list) -> str:
        stream = await async_client.chat.completions.create(messages=history, **chat)
        return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])

    path = tmp_path / "rec.jsonl"
    before = ac.usage()
    try:
        with ac.record(path) as recorder:
            with ac.workflow():
                history = [SYSTEM, {"role": "user", "content": "task"}]
                history.append(
                    {
                        "role": "assistant",
                        "content": reply_of(sync_client.chat.completions.create(messages=history, **chat)),
                    }
                )
                history.append({"role": "assistant", "content": asyncio.run(streamed_async(history))})
                with sync_client.chat.completions.create(messages=history, model="m", stream=True) as stream:
                    reply_of(stream)  # no usage asked for: recorded all the same
            ac.flush(5)
    finally:
        fake.cached_tokens = None
    after = ac.usage()
    trace = read_trace(path)
    first, second, third = trace.requests
    assert recorder.requests == 3 and len(trace.ended_workflows) == 1
    assert second.segments[len(first.segments)].content_id == first.output_id, "the streamed reply is the output"
    assert third.segments[len(second.segments)].content_id == second.output_id
    assert first.output == 3, "'reply to 2': 11 characters, 3 tokens at 4 characters each"
    assert after["requests"] - before["requests"] == 3
    assert (
        after["prompt_tokens"] - before["prompt_tokens"] == 20 and after["cached_tokens"] - before["cached_tokens"] == 8
    )


def workflow_of(body: dict) -> str | None:
    return (body.get("custom_params") or {}).get("agentcache", {}).get("workflow")


def test_thread_pool_calls_carry_the_workflow_and_the_agent_name(fake):
    client = openai.OpenAI(base_url=f"{fake.url}/v1", api_key="x")

    def ask(what):
        client.chat.completions.create(model="m", messages=[SYSTEM, {"role": "user", "content": str(what)}])

    with ThreadPoolExecutor(max_workers=2) as pool:
        with ac.workflow() as wf, ac.agent_name("coder"):
            for future in [pool.submit(ask, i) for i in range(2)]:
                future.result()
            list(pool.map(ask, range(2, 4)))
        pool.submit(ask, "after").result()  # the same worker threads, outside the workflow
    tags = {body["messages"][1]["content"]: body.get("custom_params", {}).get("agentcache") for body, _ in chats(fake)}
    assert [(tags[str(i)] or {}).get("workflow") for i in range(4)] == [wf.id] * 4, "4 of 4 tagged"
    assert {tags[str(i)]["agent_name"] for i in range(4)} == {"coder"}
    assert tags["after"] is None, "a worker thread does not keep the workflow after the task"
    assert ends(fake) == [wf.id]


def test_run_in_executor_and_to_thread_carry_the_workflow(fake):
    client = openai.OpenAI(base_url=f"{fake.url}/v1", api_key="x")

    def ask(how):
        client.chat.completions.create(model="m", messages=[SYSTEM, {"role": "user", "content": how}])

    async def main():
        async with ac.workflow() as wf:
            await asyncio.get_running_loop().run_in_executor(None, ask, "run_in_executor")
            await asyncio.to_thread(ask, "to_thread")
        return wf.id

    wid = asyncio.run(main())
    assert {body["messages"][1]["content"]: workflow_of(body) for body, _ in chats(fake)} == {
        "run_in_executor": wid,
        "to_thread": wid,
    }


def test_a_request_after_end_workflow_opens_a_new_workflow_and_leaving_ends_it(fake):
    client = openai.OpenAI(base_url=f"{fake.url}/v1", api_key="x")

    @ac.workflow
    def run():
        client.chat.completions.create(model="m", messages=[SYSTEM, {"role": "user", "content": "before"}])
        first = ac.current_workflow().id
        ac.end_workflow()
        client.chat.completions.create(model="m", messages=[SYSTEM, {"role": "user", "content": "after"}])
        return first

    first = run()
    ids = [workflow_of(body) for body, _ in chats(fake)]
    assert ids == [first, f"{first}.2"], "the ended workflow is never revived"
    assert sorted(ends(fake)) == sorted(ids), "one end per workflow, the new one's when leaving the call"
    for wid in ids:
        end_at = next(i for i, (path, _, _) in enumerate(fake.requests) if path.endswith(f"/{wid}/end"))
        assert wid not in [workflow_of(body) for _, body, _ in fake.requests[end_at:]], "no request after its end"


def test_threads_sharing_an_ended_workflow_open_exactly_one_new_one(fake):
    client = openai.OpenAI(base_url=f"{fake.url}/v1", api_key="x")
    before = ac.stats()
    all_at_once = threading.Barrier(8)

    def ask(i):
        all_at_once.wait()
        client.chat.completions.create(model="m", messages=[SYSTEM, {"role": "user", "content": str(i)}])

    with ThreadPoolExecutor(max_workers=8) as pool, ac.workflow() as wf:
        first = wf.id
        ac.end_workflow()
        list(pool.map(ask, range(8)))
    assert {workflow_of(body) for body, _ in chats(fake)} == {f"{first}.2"}
    assert ends(fake) == [f"{first}.2"], "the first workflow made no request: the server never saw it, no end"
    after = ac.stats()
    assert after["workflows"] - before["workflows"] == 2 and after["empty_workflows"] - before["empty_workflows"] == 1


def test_a_task_left_running_after_the_call_returned_is_in_no_workflow_until_it_starts_one(fake):
    client = openai.AsyncOpenAI(base_url=f"{fake.url}/v1", api_key="x")

    async def ask(what):
        await client.chat.completions.create(model="m", messages=[SYSTEM, {"role": "user", "content": what}])

    async def main():
        release = asyncio.Event()

        @ac.workflow
        async def its_own():
            await ask("its own")
            return ac.current_workflow().id

        async def left_running():
            await release.wait()
            await ask("late")
            return await its_own()

        @ac.workflow
        async def run():
            await ask("inside")
            return asyncio.create_task(left_running()), ac.current_workflow().id

        task, wid = await run()
        release.set()
        return wid, await task

    wid, own = asyncio.run(main())
    assert own != wid
    assert {body["messages"][1]["content"]: workflow_of(body) for body, _ in chats(fake)} == {
        "inside": wid,
        "late": None,
        "its own": own,
    }
    assert sorted(ends(fake)) == sorted([wid, own])


def test_a_workflow_without_a_tagged_request_sends_no_end(fake):
    before = ac.stats()
    with ac.workflow():
        pass
    assert ends(fake) == []
    after = ac.stats()
    assert after["workflows"] - before["workflows"] == 1 and after["empty_workflows"] - before["empty_workflows"] == 1


def test_ends_to_an_unreachable_worker_are_dropped_at_once_until_the_cool_down_is_over(fake, monkeypatch):
    monkeypatch.setattr(_events, "UNREACHABLE_COOLDOWN_S", 0.5)
    monkeypatch.setattr(_counters, "counters", Counter())  # the test process's exit warns of no dropped end
    worker_port = free_port()
    fake.workers = [f"http://127.0.0.1:{worker_port}"]  # behind a router, the end goes to a worker: nobody listens
    started = time.monotonic()
    with httpx.Client() as client:
        for _ in range(5):
            with ac.workflow():
                client.post(f"{fake.url}/v1/chat/completions", json={"model": "m", "messages": [SYSTEM]})
        assert ac.flush(5) and time.monotonic() - started < 2, "no retries and no back-off for a refused connection"
        stats = ac.stats()
        assert stats["dropped_ends"] == 5 and stats["ended"] == 0 and stats["unreachable"] >= 1

        worker = Recording(worker_port)
        threading.Thread(target=worker.serve_forever, daemon=True).start()
        try:
            time.sleep(0.6)  # the cool-down is over: the next end tries the worker again
            with ac.workflow() as wf:
                client.post(f"{fake.url}/v1/chat/completions", json={"model": "m", "messages": [SYSTEM]})
            assert ends(worker) == [wf.id]
        finally:
            worker.shutdown()


def test_a_worker_that_does_not_answer_ends_holds_up_neither_the_others_nor_the_queue(fake, monkeypatch):
    """Behind a router each end goes to every worker. One that accepts the connection but does not answer (a hung
    scheduler) got every end three times, each after the full timeout: the other workers' ends waited behind
    it and the queue grew with every workflow the app ran. Now a timeout trips the breaker like a refused
    connection, and at most MAX_PENDING_ENDS wait."""
    monkeypatch.setattr(_counters, "counters", Counter())  # the test process's exit warns of no dropped end
    workers = _workers_behind(fake)
    hung, healthy = workers
    hung.end_delay = 3.0
    monkeypatch.setattr(_config.settings, "end_timeout_s", 0.3)
    try:
        ids = []
        with httpx.Client() as client:
            for _ in range(4):
                with ac.workflow() as wf:
                    client.post(f"{fake.url}/v1/chat/completions", json={"model": "m", "messages": [SYSTEM]})
                ids.append(wf.id)
        started = time.monotonic()
        assert sorted(ends(healthy)) == sorted(ids)
        assert time.monotonic() - started < 2.5, "not held up behind the hung worker's retries"
        assert len([p for p, _, _ in hung.requests if p.endswith("/end")]) == 1, "tried once, then the breaker"
        assert ac.stats()["dropped_ends"] == 4, "the hung worker's part of each end was lost: counted"

        monkeypatch.setattr(_events, "MAX_PENDING", 0)
        with ac.workflow():
            httpx.post(f"{fake.url}/v1/chat/completions", json={"model": "m", "messages": [SYSTEM]})
        assert ac.stats()["dropped_ends"] == 5 and _events.sender.pending() == 0, "beyond the bound: dropped"
    finally:
        for worker in workers:
            worker.shutdown()


EXIT_SCRIPT = """
import json, sys, time
import httpx
import agentcache_sdk as ac

base_url, llm_url, exit_timeout_s = sys.argv[1:]
ac.configure(base_url=base_url)
if exit_timeout_s:
    ac.configure(exit_timeout_s=float(exit_timeout_s))
for i in range(20):
    with ac.workflow():
        if llm_url:
            try:
                httpx.post(f"{llm_url}/v1/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": str(i)}]})
            except httpx.ConnectError:
                pass
print(json.dumps({"done_at": time.time(), **ac.stats()}), flush=True)
"""


@pytest.mark.parametrize(
    "scenario",
    ["refusing server", "refusing worker", "black-hole worker", "black-hole worker, env", "empty workflows"],
)
def test_an_unreachable_server_never_holds_up_the_exit(fake, scenario):
    """20 workflows; their ends cannot be delivered: the process ends within the exit wait (the old SDK took 10-30 s)."""
    closed = f"http://127.0.0.1:{free_port()}"
    black_hole = socket.socket()  # accepts connections (the kernel does) and never answers
    black_hole.bind(("127.0.0.1", 0))
    black_hole.listen(64)
    base_url, llm_url, exit_timeout_s, env = fake.url, fake.url, "", dict(os.environ)
    if scenario == "refusing server":
        base_url = llm_url = closed  # the app's requests fail too, and it carries on
    elif scenario == "refusing worker":
        fake.workers = [closed]
    elif scenario.startswith("black-hole worker"):
        fake.workers = [f"http://127.0.0.1:{black_hole.getsockname()[1]}"]
        if scenario.endswith("env"):
            env["AGENTCACHE_EXIT_TIMEOUT_S"] = "0.5"
        else:
            exit_timeout_s = "0.5"
    else:  # the report: nothing tagged, so the server never saw these workflows
        base_url, llm_url = closed, ""
    started = time.time()
    try:
        done = subprocess.run(
            [sys.executable, "-c", EXIT_SCRIPT, base_url, llm_url, exit_timeout_s],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )
    finally:
        black_hole.close()
    exited = time.time()
    assert done.returncode == 0, done.stderr[-3000:]
    stats = json.loads(done.stdout.strip().splitlines()[-1])
    assert stats["workflows"] == 20
    wait = 0.5 if scenario.startswith("black-hole") else 2.0
    assert exited - stats["done_at"] < wait + 1.0, f"exit took {exited - stats['done_at']:.1f} s after the last line"
    assert exited - started < 6
    if scenario == "empty workflows":
        assert stats["empty_workflows"] == 20 and "dropped" not in done.stderr
    else:
        assert "agentcache: 20 workflow end events were dropped" in done.stderr, done.stderr[-3000:]


CREWAI_SCRIPT = """
import sys

import agentcache_sdk as ac
from agentcache.integrations.crewai import workflow

assert "crewai" not in sys.modules, "importing the integration imported CrewAI"
from crewai import LLM, Agent, Crew, Task

ac.configure(base_url=sys.argv[1])
llm = LLM(model="openai/default", base_url=sys.argv[1] + "/v1", api_key="x", max_tokens=8)
writer = Agent(
    role="Technical Writer", goal="Write.", backstory="You write.", llm=llm, max_iter=1, max_retry_limit=0,
    allow_delegation=False,
)
crew = Crew(agents=[writer], tasks=[Task(description="Write a post.", expected_output="Plain text.", agent=writer)])


@workflow
def solve():
    crew.kickoff()


solve()
"""


@pytest.mark.skipif(importlib.util.find_spec("crewai") is None, reason="needs CrewAI (the crewai extra)")
def test_the_crewai_integration_imports_crewai_only_through_the_app_and_still_names_agents(fake, tmp_path):
    env = {
        **os.environ,
        "HOME": str(tmp_path),
        "CREWAI_STORAGE_DIR": str(tmp_path / "storage"),
        "CREWAI_DISABLE_TELEMETRY": "true",
        "CREWAI_DISABLE_TRACKING": "true",
        "OTEL_SDK_DISABLED": "true",
        "CREWAI_DISABLE_VERSION_CHECK": "true",
        "CREWAI_TRACING_ENABLED": "false",
    }
    done = subprocess.run(
        [sys.executable, "-c", CREWAI_SCRIPT, fake.url], capture_output=True, text=True, timeout=120, env=env
    )
    assert done.returncode == 0, done.stderr[-3000:]
    ((body, _),) = chats(fake)
    assert body["custom_params"]["agentcache"]["agent_name"] == "Technical Writer", "the role, from CrewAI's hook"


HEAVY_MODULES = ("openai", "rich", "numpy", "matplotlib", "torch", "sglang")


def test_importing_the_sdk_loads_no_heavy_module():
    """An app gets the SDK with httpx alone: importing it loads neither openai (hooked when the app imports it)
    nor anything the CLI, the benchmarks or the server need."""
    script = f"import agentcache_sdk, sys; print([m for m in {HEAVY_MODULES!r} if m in sys.modules])"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "[]"


LAZY_HOOK_SCRIPT = """
import json, sys
first = sys.argv[2]
if first == "openai":
    import openai
import agentcache_sdk as ac
import openai, openai._base_client, httpx

ac.configure(base_url=sys.argv[1])
client = openai.OpenAI(base_url=sys.argv[1] + "/v1", api_key="x", max_retries=0)
with ac.workflow(workflow_id="wf-lazy"):
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
ac.flush(5)
print(json.dumps({
    "openai": openai._base_client.SyncAPIClient._prepare_options.__module__,
    "httpx": httpx.Client.send.__module__,
    "loader": type(openai.__spec__.loader).__name__,
}))
"""


@pytest.mark.parametrize("first", ["agentcache_sdk", "openai"])
def test_openai_is_hooked_whether_the_app_imports_it_before_or_after_the_sdk(fake, first):
    done = subprocess.run(
        [sys.executable, "-c", LAZY_HOOK_SCRIPT, fake.url, first], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr[-3000:]
    hooked = json.loads(done.stdout.strip().splitlines()[-1])
    assert hooked["openai"] == "agentcache_sdk._openai_hook" and hooked["httpx"] == "agentcache_sdk._httpx_hook"
    assert hooked["loader"] == "SourceFileLoader", "the module keeps its own loader"
    ((body, headers),) = chats(fake)
    assert body["custom_params"]["agentcache"]["workflow"] == "wf-lazy"
    assert headers["x-smg-routing-key"] == "wf-lazy"
    assert [p.split("/")[-2] for p, _, _ in fake.requests if p.endswith("/end")] == ["wf-lazy"]
