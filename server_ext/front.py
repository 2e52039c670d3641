"""The front of `agentcache serve --workers N`: where clients point, in front of sglang-router.

Clients without our SDK name their session in their own stack's form (SGLang's ``session_id`` and
``agent_hints``, Dynamo's headers and ``nvext``, coding agents' session headers, ``X-Session-ID``,
``prompt_cache_key``; agentcache/client_hints.py reads them all). sglang-router knows none of them: it routes by
``x-smg-routing-key`` alone and forwards neither those headers nor those body fields
(agentcache/forwarded_hints.py). So per request the front

- sets ``x-smg-routing-key`` to the session's key (``client_hints.routing_key``) where the client sent none, so
  the router's manual policy keeps a session on one worker as it keeps a workflow whose client routes by its id
  (agentcache_sdk's ``routing="workflow-affinity"``); a client's own routing key, as our SDK sends, is kept;
- packs the hint headers and body fields into the one header the router forwards, which the worker's intake
  unpacks and reads as if the client had sent them to it;
- sends ``POST /close_session`` (which the router 404s) to every worker, as the SDK sends end events;

and passes everything else through unchanged, streams included. One asyncio process (aiohttp, which SGLang
brings), started by server_ext/router.py as ``python -m agentcache.server_ext.front``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import quote

from aiohttp import ClientConnectionError, ClientSession, ClientTimeout, TCPConnector, web

from agentcache import client_hints
from agentcache.forwarded_hints import HEADER as FORWARDED_HEADER
from agentcache.forwarded_hints import pack

ROUTING_HEADER = "x-smg-routing-key"
# Hop-by-hop headers, and those aiohttp sets itself for the body it sends on.
_NOT_PASSED = frozenset({"host", "connection", "keep-alive", "transfer-encoding", "content-length", "upgrade", "te"})
# Bytes one of the hint body fields must contain for a body to be parsed at all (most bodies carry none).
_BODY_MARKERS = tuple(f'"{field}"'.encode() for field in client_hints.HINT_BODY_FIELDS)
MAX_PARSED_BODY = 64 << 20  # a JSON body this large is passed on unread


def routing_header(key: str) -> str:
    """A routing key as a header value: ASCII as is, anything else percent-encoded (as the SDK sends ids)."""
    return key if key.isascii() and key.isprintable() else quote(key, safe="")


def _json_body(raw: bytes) -> Mapping[str, Any] | None:
    if not raw or len(raw) > MAX_PARSED_BODY or not any(marker in raw for marker in _BODY_MARKERS):
        return None
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    return body if isinstance(body, Mapping) else None


def upstream_headers(headers: Mapping[str, str], raw_body: bytes) -> dict[str, str]:
    """The headers a request goes on to the router with: the routing key set from the client's session where it
    sent none, its hints packed into the forwarded header (a client's own such header dropped)."""
    out = {k: v for k, v in headers.items() if k.lower() not in _NOT_PASSED and k.lower() != FORWARDED_HEADER}
    lowered = {k.lower(): v for k, v in out.items()}
    body = _json_body(raw_body)
    if ROUTING_HEADER not in lowered:
        key = client_hints.routing_key(lowered, body or {})
        if key:
            out[ROUTING_HEADER] = routing_header(key)
    packed = pack(lowered, body, client_hints.HINT_HEADERS, client_hints.HINT_BODY_FIELDS)
    if packed is not None:
        out[FORWARDED_HEADER] = packed
    return out


class Front:
    """The front's aiohttp application: `router_url` behind it, `worker_urls` for what the router does not route."""

    def __init__(self, router_url: str, worker_urls: Sequence[str]):
        self.router_url = router_url.rstrip("/")
        self.worker_urls = [u.rstrip("/") for u in worker_urls]
        self.session: ClientSession | None = None

    def app(self) -> web.Application:
        app = web.Application(client_max_size=0)  # no cap here: the router and the workers keep their own
        app.router.add_route("POST", "/close_session", self.close_session)
        app.router.add_route("*", "/{tail:.*}", self.forward)
        app.on_startup.append(self._open)
        app.on_cleanup.append(self._close)
        return app

    async def _open(self, _app: web.Application) -> None:
        # No total timeout: an answer streams for as long as it generates. No connection cap: each request in
        # flight holds one.
        self.session = ClientSession(
            connector=TCPConnector(limit=0), timeout=ClientTimeout(total=None, sock_connect=10), auto_decompress=False
        )

    async def _close(self, _app: web.Application) -> None:
        if self.session is not None:
            await self.session.close()

    async def forward(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        headers = upstream_headers(request.headers, raw)
        try:
            return await self._relay(request, headers, raw)
        except ClientConnectionError as exc:  # the router is down or went away before answering
            return web.json_response({"error": f"sglang-router did not answer: {exc}"}, status=502)

    async def _relay(self, request: web.Request, headers: dict[str, str], raw: bytes) -> web.StreamResponse:
        assert self.session is not None
        async with self.session.request(
            request.method, f"{self.router_url}{request.rel_url}", headers=headers, data=raw or None
        ) as upstream:
            answer = web.StreamResponse(
                status=upstream.status,
                reason=upstream.reason,
                headers={k: v for k, v in upstream.headers.items() if k.lower() not in _NOT_PASSED},
            )
            await answer.prepare(request)
            async for chunk in upstream.content.iter_any():
                await answer.write(chunk)
            await answer.write_eof()
            return answer

    async def close_session(self, request: web.Request) -> web.Response:
        """SGLang's /close_session, sent to every worker (the router has no such route; a session lives on the
        worker its routing key chose, which the front does not track): the first success, else the first answer."""
        raw = await request.read()
        headers = upstream_headers(request.headers, raw)
        headers.pop(ROUTING_HEADER, None)
        assert self.session is not None

        async def close(url: str) -> tuple[int, bytes, str]:
            async with self.session.post(f"{url}/close_session", headers=headers, data=raw) as r:  # type: ignore[union-attr]
                return r.status, await r.read(), r.content_type

        answers = await asyncio.gather(*(close(u) for u in self.worker_urls), return_exceptions=True)
        heard = [a for a in answers if not isinstance(a, BaseException)]
        if not heard:
            return web.json_response({"error": f"no worker answered /close_session: {answers[0]!r}"}, status=502)
        status, body, content_type = next((a for a in heard if 200 <= a[0] < 300), heard[0])
        return web.Response(status=status, body=body, content_type=content_type)


def front_command(router_url: str, worker_urls: Sequence[str], *, host: str, port: int) -> list[str]:
    """The command line that starts the front on `host:port` in front of the router at `router_url`."""
    return [
        sys.executable,
        "-m",
        "agentcache.server_ext.front",
        "--host",
        host,
        "--port",
        str(port),
        "--router-url",
        router_url,
        "--worker-urls",
        *worker_urls,
    ]


def main(argv: Sequence[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m agentcache.server_ext.front")
    parser.add_argument("--host", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--router-url", required=True)
    parser.add_argument("--worker-urls", nargs="+", required=True)
    args = parser.parse_args(argv)
    web.run_app(
        Front(args.router_url, args.worker_urls).app(), host=args.host, port=args.port, print=None, access_log=None
    )


if __name__ == "__main__":
    main(sys.argv[1:])
