"""httpx's request hook: every request to the configured server, tagged as it is sent (clients that do not use
the openai SDK), routed workflow-aware behind a cluster, and its answer read as it passes."""

from __future__ import annotations

import time
from typing import Any

import httpx

from agentcache_sdk._answers import JSONAnswer, StreamedAnswer, answer_of, observe, reader_for
from agentcache_sdk._tagging import retag_or_leave


class _TeeStream(httpx.SyncByteStream):
    """A response body read lazily by the client (the openai SDK reads its JSON that way, and every streamed
    answer): fed to `reader` as it passes, and observed once read (or closed)."""

    def __init__(self, inner: Any, reader: JSONAnswer | StreamedAnswer, done: Any):
        self._inner, self._reader, self._done = inner, reader, done

    def __iter__(self) -> Any:
        for chunk in self._inner:
            self._reader.feed(chunk)
            yield chunk

    def close(self) -> None:
        self._inner.close()
        done, self._done = self._done, None
        if done is not None:
            done(self._reader.answer())


class _AsyncTeeStream(httpx.AsyncByteStream):
    def __init__(self, inner: Any, reader: JSONAnswer | StreamedAnswer, done: Any):
        self._inner, self._reader, self._done = inner, reader, done

    async def __aiter__(self) -> Any:
        async for chunk in self._inner:
            self._reader.feed(chunk)
            yield chunk

    async def aclose(self) -> None:
        await self._inner.aclose()
        done, self._done = self._done, None
        if done is not None:
            done(self._reader.answer())


def install() -> None:
    """Wrap httpx's send, sync and async (run once httpx is imported)."""
    sync_send = httpx.Client.send
    async_send = httpx.AsyncClient.send

    # A routed request's ticket is handed back exactly once: when its answer was read, or its stream closed
    # (streamed answers: the openai SDK closes them once read), or when sending or reading it failed.

    def send(self: httpx.Client, request: httpx.Request, **kwargs: Any) -> httpx.Response:
        request, body, tags, ticket = retag_or_leave(request)
        sent_at = time.monotonic()
        try:
            response = sync_send(self, request, **kwargs)
            if body is not None:
                if kwargs.get("stream"):
                    response.stream = _TeeStream(
                        response.stream,
                        reader_for(body),
                        lambda data: observe(sent_at, body, tags, ticket, response, data),
                    )
                else:
                    observe(sent_at, body, tags, ticket, response, answer_of(body, response.read()))
        except BaseException:
            if ticket is not None:
                ticket.done()
            raise
        return response

    async def send_async(self: httpx.AsyncClient, request: httpx.Request, **kwargs: Any) -> httpx.Response:
        request, body, tags, ticket = retag_or_leave(request)
        sent_at = time.monotonic()
        try:
            response = await async_send(self, request, **kwargs)
            if body is not None:
                if kwargs.get("stream"):
                    response.stream = _AsyncTeeStream(
                        response.stream,
                        reader_for(body),
                        lambda data: observe(sent_at, body, tags, ticket, response, data),
                    )
                else:
                    observe(sent_at, body, tags, ticket, response, answer_of(body, await response.aread()))
        except BaseException:
            if ticket is not None:
                ticket.done()
            raise
        return response

    httpx.Client.send = send
    httpx.AsyncClient.send = send_async
