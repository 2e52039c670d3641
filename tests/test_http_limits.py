"""The limits in front of the engine, on a small ASGI app (the live server's 413: tests/test_intake_e2e.py)."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

import pytest

from agentcache.server_ext.http_limits import BodyLimits, HttpLimits, limit_uvicorn, with_header_deadline


async def echo_length(scope, receive, send):
    """An app that reads the whole body and answers with its length (a parse error on a body cut short)."""
    size, more = 0, True
    try:
        while more:
            message = await receive()
            size += len(message.get("body", b""))
            more = message.get("more_body", False)
    except Exception:
        await send({"type": "http.response.start", "status": 400, "headers": []})
        await send({"type": "http.response.body", "body": b"cannot parse"})
        return
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": str(size).encode()})


def call(limits: HttpLimits, chunks: list[bytes], length: int | None = None, pause_s: float = 0.0):
    """Status and body of a POST whose body comes in `chunks` (`pause_s` before each)."""
    headers = [(b"content-length", str(length).encode())] if length is not None else []
    scope = {"type": "http", "method": "POST", "path": "/generate", "headers": headers}
    sent: list[dict] = []
    queue = list(chunks)

    async def receive():
        await asyncio.sleep(pause_s)
        body = queue.pop(0)
        return {"type": "http.request", "body": body, "more_body": bool(queue)}

    async def send(message):
        sent.append(message)

    asyncio.run(BodyLimits(echo_length, limits)(scope, receive, send))
    return sent[0]["status"], sent[-1]["body"]


def test_a_body_over_the_limit_is_refused_with_413_naming_the_limit():
    limits = HttpLimits(max_body_bytes=100, body_timeout_s=5)
    assert call(limits, [b"x" * 60, b"x" * 40]) == (200, b"100")
    status, body = call(limits, [b"x" * 200], length=200)  # said by Content-Length: refused before reading
    assert status == 413 and "AGENTCACHE_MAX_BODY_BYTES" in json.loads(body)["error"]
    status, body = call(limits, [b"x" * 60, b"x" * 60])  # chunked, no length: refused once over it
    assert status == 413 and "100 bytes" in json.loads(body)["error"]


def test_a_slow_sender_times_out_with_408():
    status, body = call(HttpLimits(max_body_bytes=0, body_timeout_s=0.2), [b"x", b"x", b"x"], pause_s=0.1)
    assert status == 408 and "AGENTCACHE_BODY_TIMEOUT_S" in json.loads(body)["error"]
    assert call(HttpLimits(max_body_bytes=0, body_timeout_s=0), [b"x", b"x"], pause_s=0.05) == (200, b"2")


def test_uvicorn_gets_a_connection_cap_and_a_header_deadline_unless_set(monkeypatch):
    import uvicorn

    monkeypatch.setenv("AGENTCACHE_MAX_CONNECTIONS", "7")
    args, kwargs = limit_uvicorn(None, "app", host="h")
    assert kwargs["limit_concurrency"] == 7 and uvicorn.Config(*args[1:], **kwargs).limit_concurrency == 7
    assert kwargs["http"].__name__ == "HeaderDeadlineProtocol"
    assert limit_uvicorn(None, "app", limit_concurrency=3, http="h11")[1] == {"limit_concurrency": 3, "http": "h11"}
    monkeypatch.setenv("AGENTCACHE_MAX_CONNECTIONS", "lots")
    with pytest.raises(SystemExit, match="AGENTCACHE_MAX_CONNECTIONS"):
        HttpLimits.from_env()


def test_a_connection_that_never_finishes_its_headers_is_closed_with_408():
    import uvicorn

    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    protocol = with_header_deadline(0.3)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, http=protocol, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.02)
        with socket.create_connection(("127.0.0.1", port), timeout=5) as whole:
            whole.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            assert whole.recv(4096).startswith(b"HTTP/1.1 200")
            time.sleep(0.5)  # kept alive past the deadline: it runs from a request's first byte
            whole.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            assert whole.recv(4096).startswith(b"HTTP/1.1 200")
        for sent in (b"", b"GET / HTTP/1.1\r\nHost: x\r\n"):
            with socket.create_connection(("127.0.0.1", port), timeout=5) as slow:
                slow.sendall(sent)
                start = time.monotonic()
                reply = slow.recv(4096)
                assert reply.startswith(b"HTTP/1.1 408") and b"AGENTCACHE_HEADER_TIMEOUT_S" in reply
                assert slow.recv(4096) == b"" and time.monotonic() - start < 2, "closed"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
