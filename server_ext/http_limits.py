"""Limits in front of the engine: a request body's size, how long its body may take to arrive, connections.

SGLang's HTTP server (FastAPI on uvicorn) reads any body whole, waits for a
slow sender as long as it sends, and takes every connection. The plugin adds
an ASGI middleware (:class:`BodyLimits`) that answers a body over the limit
with HTTP 413 (at once where its Content-Length says so, else once that many
bytes arrived) and a body that takes longer than the timeout with HTTP 408,
both as JSON naming the limit; it caps uvicorn's concurrent connections
(``limit_concurrency``: beyond it, HTTP 503), and gives a request's headers a
deadline (uvicorn has none: a connection that never finishes its headers held
its slot for good) by its own subclass of uvicorn's httptools protocol. Each
is set by an environment variable (0 turns it off); docs/usage.md lists them.
A route that takes small bodies only (the tool events) reads its body through
:func:`read_capped`, with a limit of its own.
"""

from __future__ import annotations

import asyncio
import json
import os
from dataclasses import dataclass
from typing import Any

MAX_BODY_ENV = "AGENTCACHE_MAX_BODY_BYTES"
BODY_TIMEOUT_ENV = "AGENTCACHE_BODY_TIMEOUT_S"
MAX_CONNECTIONS_ENV = "AGENTCACHE_MAX_CONNECTIONS"
HEADER_TIMEOUT_ENV = "AGENTCACHE_HEADER_TIMEOUT_S"


@dataclass(frozen=True)
class HttpLimits:
    max_body_bytes: int = 64 << 20  # a 128k-token prompt as JSON ids is ~1 MB; images in chat are larger
    body_timeout_s: float = 60.0  # from the request's headers to its body's last byte
    max_connections: int = 4096  # uvicorn's limit_concurrency: connections (and requests) at once
    header_timeout_s: float = 30.0  # from a connection (or a kept-alive one's next request) to its headers' end

    @staticmethod
    def from_env() -> HttpLimits:
        """The limits the environment sets; a value that is no number fails the start, naming the variable."""
        values = {}
        for name, env, kind in (
            ("max_body_bytes", MAX_BODY_ENV, int),
            ("body_timeout_s", BODY_TIMEOUT_ENV, float),
            ("max_connections", MAX_CONNECTIONS_ENV, int),
            ("header_timeout_s", HEADER_TIMEOUT_ENV, float),
        ):
            raw = os.environ.get(env)
            if raw is not None:
                try:
                    values[name] = kind(raw)
                except ValueError:
                    raise SystemExit(f"agentcache: {env}={raw!r} is not a number") from None
                if values[name] < 0:
                    raise SystemExit(f"agentcache: {env}={raw!r} must be >= 0 (0: no limit)")
        return HttpLimits(**values)


class _Refused(Exception):
    """Raised from `receive` into the app, which never gets the body whole."""


async def _answer(send: Any, status: int, message: str) -> None:
    body = json.dumps({"error": message}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers + [(b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})


class BodyLimits:
    """ASGI middleware: a body over `max_body_bytes` gets 413, one slower than `body_timeout_s` 408."""

    def __init__(self, app: Any, limits: HttpLimits):
        self.app, self.limits = app, limits

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        limits = self.limits
        too_large = f"the request body is over {limits.max_body_bytes} bytes, this server's limit ({MAX_BODY_ENV})"
        length = dict(scope.get("headers") or ()).get(b"content-length")
        if limits.max_body_bytes and length is not None and length.isdigit() and int(length) > limits.max_body_bytes:
            return await _answer(send, 413, too_large)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + limits.body_timeout_s if limits.body_timeout_s else None
        state: dict[str, Any] = {"received": 0, "done": False, "refusal": None, "started": False}

        async def limited_receive() -> Any:
            if state["done"] or deadline is None:
                message = await receive()
            else:
                try:
                    message = await asyncio.wait_for(receive(), max(deadline - loop.time(), 0.0))
                except TimeoutError:
                    state["refusal"] = (
                        408,
                        f"the request body did not arrive within {limits.body_timeout_s:g} s, this server's limit"
                        f" ({BODY_TIMEOUT_ENV})",
                    )
                    raise _Refused from None
            if message["type"] == "http.request":
                state["received"] += len(message.get("body", b""))
                if limits.max_body_bytes and state["received"] > limits.max_body_bytes:
                    state["refusal"] = (413, too_large)
                    raise _Refused
                state["done"] = not message.get("more_body", False)
            return message

        async def guarded_send(message: Any) -> None:
            if state["refusal"] is not None:
                return  # the app's answer to a body it never got whole: ours goes instead
            state["started"] = state["started"] or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited_receive, guarded_send)
        except Exception:
            if state["refusal"] is None:
                raise
        if state["refusal"] is not None and not state["started"]:
            await _answer(send, *state["refusal"])


class BodyTooLarge(ValueError):
    """A route's body over that route's own limit (HTTP 413)."""


async def read_capped(request: Any, max_bytes: int) -> bytes:
    """The body of a route that takes small bodies only (the tool events): BodyTooLarge past `max_bytes`, at once
    where its Content-Length says so, else once that many bytes arrived (never the whole of a larger body)."""
    too_large = f"the request body is over {max_bytes} bytes, this route's limit"
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > max_bytes:
        raise BodyTooLarge(too_large)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise BodyTooLarge(too_large)
        chunks.append(chunk)
    return b"".join(chunks)


def install(app: Any, limits: HttpLimits) -> None:
    """The body limits on SGLang's app (before uvicorn starts it)."""
    if limits.max_body_bytes or limits.body_timeout_s:
        app.add_middleware(BodyLimits, limits=limits)


def with_header_deadline(timeout_s: float) -> type:
    """uvicorn's httptools protocol, closing a connection whose request headers are not whole within `timeout_s`
    (from the connection, or from a kept-alive connection's next request) with HTTP 408."""
    from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

    class HeaderDeadlineProtocol(HttpToolsProtocol):
        _header_timer: asyncio.TimerHandle | None = None

        def _arm(self) -> None:
            if self._header_timer is None:
                self._header_timer = self.loop.call_later(timeout_s, self._headers_too_slow)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._arm()

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._arm()

        def on_headers_complete(self) -> None:
            self._disarm()
            super().on_headers_complete()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _headers_too_slow(self) -> None:
            self._header_timer = None
            if not self.transport.is_closing():
                message = f"the request headers did not arrive within {timeout_s:g} s ({HEADER_TIMEOUT_ENV})".encode()
                head = b"content-type: text/plain\r\nconnection: close\r\ncontent-length: %d\r\n\r\n" % len(message)
                self.transport.write(STATUS_LINE[408] + head + message)
                self.transport.close()

    return HeaderDeadlineProtocol


def limit_uvicorn(config: Any, *args: Any, **kwargs: Any) -> Any:  # BEFORE hook on uvicorn.Config.__init__
    """uvicorn's connection cap and a deadline for headers, where SGLang sets neither."""
    limits = HttpLimits.from_env()
    if limits.max_connections and kwargs.get("limit_concurrency") is None:
        kwargs["limit_concurrency"] = limits.max_connections
    if limits.header_timeout_s and kwargs.get("http", "auto") in ("auto", "httptools"):
        try:
            kwargs["http"] = with_header_deadline(limits.header_timeout_s)
        except ImportError:  # no httptools: uvicorn's h11 protocol, without a deadline
            pass
    return (config, *args), kwargs
