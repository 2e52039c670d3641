"""Whether the configured server is sglang-router in front of agentcache workers, and which workers it has.

The router answers 404 on ``/agentcache/...``, so an end event (or a batch of
tool events) sent to it is lost; it does list its workers on ``GET /workers``,
and each goes to every healthy one (a worker that never saw the workflow
answers ``ended: false`` and changes nothing). The same listing tells the request hooks that
the server is a cluster of N workers, so that they can choose a routing slot
per request (agentcache_sdk._routing). A plain SGLang server answers 404 (or
anything but the router's shape) there: it is its own end target, and no
cluster. The answer is cached per base URL for a short time, so a burst of
ends costs one lookup. The request hooks wait for a lookup only the first time
(briefly: a router answers from memory), and refresh a stale answer in the
background; a lookup that failed (the server down, hung or answering 5xx) is
asked again only FAILED_RETRY_S later, in the background: meanwhile requests
go keyed by their workflow, neither waiting for it nor doubling the load on a
server in trouble.

httpx is imported where a lookup is made, not with the SDK: the SDK looks up
workers only for requests and end events that went through httpx.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

from agentcache.router_workers import parse_router_workers

if TYPE_CHECKING:
    import httpx

Timeout = float | tuple[float, float, float, float]  # httpx's: seconds, or (connect, read, write, pool)

TARGETS_TTL_S = 30.0
LOOKUP_TIMEOUT: Timeout = (1.0, 5.0, 5.0, 5.0)  # a server that does not accept at once is unreachable
REQUEST_LOOKUP_TIMEOUT: Timeout = 1.0  # the one lookup a request waits for (in an async app, its event loop)
FAILED_RETRY_S = 5.0

# base URL -> (looked up at, end targets, workers behind it: None for a plain server)
_cache: dict[str, tuple[float, list[str], int | None]] = {}
_failed: dict[str, float] = {}  # base URL -> when its last lookup failed (cleared by one that answers)
_refreshing: set[str] = set()
_lock = threading.Lock()


def _lookup(
    client: httpx.Client, base_url: str, headers: dict[str, str], timeout: Timeout = LOOKUP_TIMEOUT
) -> tuple[list[str], int | None] | None:
    """(end targets, workers or None) for `base_url`, cached; None when it cannot be told now (not cached, and
    the failure noted)."""
    answer = _ask(client, base_url, headers, timeout)
    with _lock:
        if answer is None:
            _failed[base_url] = time.monotonic()
        else:
            _cache[base_url] = (time.monotonic(), *answer)
            _failed.pop(base_url, None)
    return answer


def _ask(
    client: httpx.Client, base_url: str, headers: dict[str, str], timeout: Timeout
) -> tuple[list[str], int | None] | None:
    import httpx

    try:
        r = client.get(f"{base_url}/workers", headers=headers, timeout=timeout)
    except httpx.HTTPError:
        return None  # unreachable: the end event's own retries and warning deal with it
    listing = None
    if r.status_code == 200:
        try:
            listing = parse_router_workers(r.json())
        except ValueError:
            listing = None
    if (listing is not None and not listing.healthy) or r.status_code >= 500:
        return None  # a router with no healthy worker, or a server in trouble
    return (listing.healthy, listing.listed) if listing is not None else ([base_url], None)


def end_targets(client: httpx.Client, base_url: str, headers: dict[str, str]) -> list[str]:
    """The base URLs to send an end event or events to: the router's healthy workers, else `base_url` itself."""
    with _lock:
        cached, failed_at, now = _cache.get(base_url), _failed.get(base_url), time.monotonic()
    if cached is not None and now - cached[0] < TARGETS_TTL_S:
        return cached[1]
    if failed_at is not None and now - failed_at < FAILED_RETRY_S:
        return [base_url]  # asked a moment ago: an end waits for no second lookup
    answer = _lookup(client, base_url, headers)
    return answer[0] if answer is not None else [base_url]


def cluster_size(base_url: str, headers: dict[str, str]) -> int | None:
    """How many workers sglang-router at `base_url` lists (healthy or not); None for a plain server, or when
    it cannot be told. Looks up synchronously only the first time; a stale answer is refreshed in the
    background while it keeps being used, and a failed lookup is retried in the background once it is
    FAILED_RETRY_S old."""
    with _lock:
        cached, failed_at, now = _cache.get(base_url), _failed.get(base_url), time.monotonic()
        first = cached is None and failed_at is None
        refresh = (
            not first
            and (cached is None or now - cached[0] >= TARGETS_TTL_S)
            and (failed_at is None or now - failed_at >= FAILED_RETRY_S)
            and base_url not in _refreshing
        )
        if refresh:
            _refreshing.add(base_url)
    if first:
        import httpx

        with httpx.Client() as client:
            answer = _lookup(client, base_url, headers, REQUEST_LOOKUP_TIMEOUT)
        return answer[1] if answer is not None else None
    if refresh:
        threading.Thread(target=_refresh, args=(base_url, dict(headers)), daemon=True).start()
    return cached[2] if cached is not None else None


def _refresh(base_url: str, headers: dict[str, str]) -> None:
    import httpx

    try:
        with httpx.Client() as client:
            _lookup(client, base_url, headers)
    finally:
        with _lock:
            _refreshing.discard(base_url)
