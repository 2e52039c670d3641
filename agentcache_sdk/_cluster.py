"""Where an end event must go when the configured server is sglang-router rather than one SGLang server.

The router pins a workflow to one worker (by the ``x-smg-routing-key`` the SDK
sends) but answers 404 on ``/agentcache/...``, so an end event sent to it is
lost. The router does list its workers on ``GET /workers``; an end event goes
to each healthy one (a worker that never saw the workflow answers
``ended: false`` and changes nothing). A plain SGLang server answers 404 (or
anything but the router's shape) there, and is its own target. The answer is
cached per base URL for a short time, so a burst of ends costs one lookup.
"""

from __future__ import annotations

import re
import threading
import time

import httpx

TARGETS_TTL_S = 30.0
LOOKUP_TIMEOUT = httpx.Timeout(5.0, connect=1.0)  # a server that does not accept at once is unreachable

_DP_RANK = re.compile(r"@\d+$")  # the router's --dp-aware mode lists a worker once per rank as `url@rank`
_cache: dict[str, tuple[float, list[str]]] = {}
_lock = threading.Lock()


def router_workers(payload: object) -> list[str] | None:
    """Healthy worker base URLs from a `GET /workers` answer of sglang-router (0.3.x), or None for another shape.

    The router answers ``{"workers": [{"url": ..., "is_healthy": ..., ...}], "total": n, "stats": {...}}``.
    """
    if not isinstance(payload, dict) or not isinstance(payload.get("workers"), list):
        return None
    urls: list[str] = []
    for worker in payload["workers"]:
        if not isinstance(worker, dict) or not isinstance(worker.get("url"), str):
            return None
        if worker.get("is_healthy", True):
            urls.append(_DP_RANK.sub("", worker["url"]).rstrip("/"))
    return list(dict.fromkeys(urls))


def end_targets(client: httpx.Client, base_url: str, headers: dict[str, str]) -> list[str]:
    """The base URLs to send an end event to: the router's healthy workers, else `base_url` itself."""
    now = time.monotonic()
    with _lock:
        cached = _cache.get(base_url)
    if cached is not None and now - cached[0] < TARGETS_TTL_S:
        return cached[1]
    try:
        r = client.get(f"{base_url}/workers", headers=headers, timeout=LOOKUP_TIMEOUT)
    except httpx.HTTPError:
        return [base_url]  # unreachable: the end event's own retries and warning deal with it; ask again next time
    workers = None
    if r.status_code == 200:
        try:
            workers = router_workers(r.json())
        except ValueError:
            workers = None
    if workers == [] or r.status_code >= 500:
        return [base_url]  # a router with no healthy worker, or a server in trouble: ask again next time
    targets = workers if workers is not None else [base_url]
    with _lock:
        _cache[base_url] = (now, targets)
    return targets
