"""The front of `agentcache serve --workers N`: other clients' session keys route a session as our workflow ids do,
and their hints reach the worker past sglang-router (the real router, stand-in workers that record what they get)."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from agentcache.forwarded_hints import HEADER, MAX_CHARS, pack, unpack, with_forwarded
from agentcache.server_ext.front import routing_header, upstream_headers


def test_hints_are_packed_unchanged_and_unpacked_and_nothing_else_is():
    headers = {"X-Dynamo-Session-ID": "s1", "cookie": "c=1", "x-dynamo-session-final": "true"}
    body = {"agent_hints": {"agent_id": "coder"}, "input_ids": [1, 2], "nvext": {"agent_context": {"session_id": "d"}}}
    packed = pack(headers, body, {"x-dynamo-session-id", "x-dynamo-session-final"}, {"agent_hints", "nvext"})
    assert packed.isascii() and packed.isprintable()
    assert unpack(packed) == (
        {"x-dynamo-session-id": "s1", "x-dynamo-session-final": "true"},
        {"agent_hints": {"agent_id": "coder"}, "nvext": {"agent_context": {"session_id": "d"}}},
    )
    assert pack({"cookie": "c"}, {"input_ids": [1]}, {"x-session-id"}, {"session_id"}) is None
    # A field too large for a header is left out (the reader refuses values that large anyway); the rest goes on.
    big = {"session_id": "s", "agent_hints": {"step_id": "x" * MAX_CHARS}}
    assert unpack(pack({}, big, set(), {"session_id", "agent_hints"})) == ({}, {"session_id": "s"})
    for bad in (None, "", "not json", "[1]", json.dumps({"headers": [1], "body": 2}), "x" * (MAX_CHARS + 1)):
        assert unpack(bad) == ({}, {})
    # On the worker: the client's headers and fields back, the front's routing key aside (a client's own came packed).
    worker_got = {"X-Smg-Routing-Key": "s1", HEADER: packed, "authorization": "Bearer k"}
    assert with_forwarded(worker_got, {"text": "hi"}) == (
        {"authorization": "Bearer k", "x-dynamo-session-id": "s1", "x-dynamo-session-final": "true"},
        {"agent_hints": {"agent_id": "coder"}, "nvext": {"agent_context": {"session_id": "d"}}, "text": "hi"},
    )
    assert with_forwarded({"X-Smg-Routing-Key": "k"}, {}) == ({"x-smg-routing-key": "k"}, {}), "no front: as sent"
    assert routing_header("研究-1") == "%E7%A0%94%E7%A9%B6-1" and routing_header("wf-1") == "wf-1"


def test_the_front_routes_by_the_session_the_client_names_and_keeps_a_clients_own_key():
    ours = {"x-request-id-agentcache": json.dumps({"v": 1, "workflow": "wf-ours", "agent": "a"})}
    assert upstream_headers(ours, b"")["x-smg-routing-key"] == "wf-ours", "our tags, sent without a routing key"
    assert upstream_headers({"x-session-id": "s", "x-smg-routing-key": "k"}, b"")["x-smg-routing-key"] == "k"
    out = upstream_headers({"X-Session-ID": "s", "Host": "h", "content-length": "9"}, b'{"text": "x"}')
    assert out["x-smg-routing-key"] == "s" and "Host" not in out and "content-length" not in out
    assert unpack(out[HEADER]) == ({"x-session-id": "s"}, {})
    body = json.dumps({"text": "x", "session_id": "sess", "agent_hints": {"agent_id": "coder"}}).encode()
    out = upstream_headers({HEADER: '{"headers": {"x-session-id": "forged"}}'}, body)
    assert out["x-smg-routing-key"] == "sess"
    assert unpack(out[HEADER]) == ({}, {"session_id": "sess", "agent_hints": {"agent_id": "coder"}}), (
        "a client's own forwarded header is replaced by what it sent"
    )
    assert "x-smg-routing-key" not in upstream_headers({}, b'{"text": "untagged"}')


class _Recording(BaseHTTPRequestHandler):
    """A stand-in worker: records (path, headers) of every POST, answers like SGLang enough for the router."""

    heard: list[tuple[str, dict[str, str]]]
    name: str

    def log_message(self, *args):  # noqa: ANN002
        pass

    def _answer(self, data: dict) -> None:
        raw = json.dumps(data).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def do_GET(self):  # noqa: N802 - health checks and the router's model discovery
        self._answer({"model_path": "m", "data": [{"id": "m"}]})

    def do_POST(self):  # noqa: N802
        self.rfile.read(int(self.headers.get("content-length") or 0))
        self.heard.append((self.path, {k.lower(): v for k, v in self.headers.items()}))
        self._answer({"text": "ok", "meta_info": {"prompt_tokens": 1, "cached_tokens": 0}, "worker": self.name})


@pytest.fixture(scope="module")
def front_before_router() -> Iterator[tuple[str, list[list[tuple[str, dict[str, str]]]]]]:
    """Two stand-in workers, sglang-router (manual policy) before them, the front before it: (front URL, what each
    worker heard)."""
    pytest.importorskip("sglang_router")
    from agentcache.server_ext.front import front_command
    from agentcache.server_ext.launcher import free_port
    from agentcache.server_ext.router_process import router_command

    servers, heard = [], []
    for i in range(2):
        log: list[tuple[str, dict[str, str]]] = []
        handler = type(f"Worker{i}", (_Recording,), {"heard": log, "name": str(i)})
        server = ThreadingHTTPServer(("127.0.0.1", free_port()), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        heard.append(log)
    workers = [f"http://127.0.0.1:{s.server_address[1]}" for s in servers]
    router_port, front_port = free_port(), free_port()
    router_url, front_url = f"http://127.0.0.1:{router_port}", f"http://127.0.0.1:{front_port}"
    processes = [
        subprocess.Popen(
            router_command(workers, host="127.0.0.1", port=router_port, metrics_port=free_port()),
            stdout=subprocess.DEVNULL,  # it warns that it cannot fetch the stand-in model's tokenizer
            stderr=subprocess.DEVNULL,
        ),
        subprocess.Popen(front_command(router_url, workers, host="127.0.0.1", port=front_port)),
    ]
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if len(httpx.get(f"{front_url}/workers", timeout=2).json()["workers"]) == 2:
                    break
            except (httpx.HTTPError, ValueError, KeyError):
                pass
            assert time.monotonic() < deadline, "the router and the front did not start"
            time.sleep(0.2)
        yield front_url, heard
    finally:
        for process in processes:
            process.terminate()
            process.wait(10)
        for server in servers:
            server.shutdown()


# (request headers, body fields) naming session S in each form the front routes by
FORMS = {
    "sglang_session_id": ({}, {"session_id": "S"}),
    "sglang_agent_hints": ({}, {"agent_hints": {"workflow_id": "S", "agent_id": "coder"}}),
    "nvext_agent_context": ({}, {"nvext": {"agent_context": {"session_id": "S"}}}),
    "dynamo_headers": ({"X-Dynamo-Session-ID": "S"}, {}),
    "claude_code": ({"x-claude-code-session-id": "S", "x-claude-code-agent-id": "explore"}, {}),
    "codex": ({"session-id": "S"}, {}),
    "x_session_id": ({"X-Session-ID": "S"}, {}),
    "prompt_cache_key": ({}, {"prompt_cache_key": "S"}),
}


CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize("form", list(FORMS))
def test_a_sessions_requests_in_any_form_go_to_one_worker_with_their_hints(front_before_router, form):
    from agentcache.client_hints import read_client_hints

    url, heard = front_before_router
    headers, fields = FORMS[form]
    sessions = [f"{form}-{i}" for i in range(6)]
    before = [len(h) for h in heard]
    with httpx.Client(base_url=url, timeout=30) as client:
        for _ in range(3):
            for session in sessions:
                named = {k: v.replace("S", session) for k, v in headers.items()}
                body = json.loads(json.dumps(fields).replace('"S"', json.dumps(session)))
                for path, request in (("/generate", {"text": "hi"}), ("/v1/chat/completions", CHAT)):
                    r = client.post(path, json={**request, **body}, headers=named)
                    assert r.status_code == 200, r.text
    workers_of: dict[str, set[int]] = {}
    for worker, log in enumerate(heard):
        for path, got in log[before[worker] :]:
            hints = read_client_hints(*with_forwarded(got, {}))
            assert hints is not None and hints.form == form, (path, got)
            assert got["x-smg-routing-key"] == hints.workflow
            workers_of.setdefault(hints.workflow, set()).add(worker)
    assert sorted(workers_of) == sorted(sessions), "every request reached a worker with its session's hints"
    assert all(len(w) == 1 for w in workers_of.values()), f"each session on one worker: {workers_of}"


def test_close_session_reaches_every_worker(front_before_router):
    url, heard = front_before_router
    before = [len(h) for h in heard]
    r = httpx.post(f"{url}/close_session", json={"session_id": "S"}, headers={"Authorization": "Bearer k"}, timeout=30)
    assert r.status_code == 200
    for worker, log in enumerate(heard):
        (closed,) = log[before[worker] :]
        assert closed[0] == "/close_session" and closed[1]["authorization"] == "Bearer k"


def test_the_front_carries_every_header_and_body_field_the_hints_reader_reads():
    """client_hints.HINT_HEADERS and HINT_BODY_FIELDS name all that its parsers look up: a form added there with a
    name missing here would be dropped by the router behind the front."""
    from agentcache import client_hints

    class Probe(dict):
        """Answers every name with a valid id (so each parser reads on), and records the names asked."""

        def __init__(self):
            super().__init__()
            self.asked: set[str] = set()

        def get(self, name, default=None):
            self.asked.add(name)
            return "probe-1"

    for parse in (*client_hints.PARSERS.values(), *client_hints.HINT_PARSERS):
        headers, body = Probe(), Probe()
        try:
            parse(headers, body)
        except client_hints.HintError:
            pass  # a body field answered with an id where an object belongs: its name was asked all the same
        assert headers.asked <= client_hints.HINT_HEADERS, parse.__name__
        assert body.asked <= client_hints.HINT_BODY_FIELDS, parse.__name__


def test_a_front_whose_router_is_gone_answers_502_not_a_traceback():
    from agentcache.server_ext.front import front_command
    from agentcache.server_ext.launcher import free_port

    port = free_port()
    gone = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    front = subprocess.Popen(front_command(gone, [gone], host="127.0.0.1", port=port))
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                r = httpx.post(f"http://127.0.0.1:{port}/generate", json={"text": "hi", "session_id": "s"}, timeout=5)
                break
            except httpx.ConnectError:
                assert time.monotonic() < deadline, "the front did not start"
                time.sleep(0.2)
        assert r.status_code == 502 and "sglang-router did not answer" in r.json()["error"]
        r = httpx.post(f"http://127.0.0.1:{port}/close_session", json={"session_id": "s"}, timeout=5)
        assert r.status_code == 502 and "no worker answered" in r.json()["error"]
    finally:
        front.terminate()
        front.wait(10)
