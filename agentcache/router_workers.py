"""The one reader of sglang-router's worker list (``GET /workers``), for the SDK and the cluster launcher.

Kept free of heavy imports: the SDK imports it in a user's app.
"""

from __future__ import annotations

import re
from typing import NamedTuple

_DP_RANK = re.compile(r"@\d+$")  # the router's --dp-aware mode lists a worker once per rank as `url@rank`


class RouterWorkers(NamedTuple):
    healthy: list[str]  # base URLs of the workers the router marks healthy, each once, in listed order
    listed: int  # workers listed, healthy or not (a rank of a --dp-aware worker is not a worker of its own)


def parse_router_workers(payload: object) -> RouterWorkers | None:
    """The workers in a `GET /workers` answer of sglang-router (0.3.x), or None for another shape (a plain
    SGLang server answers 404's ``{"detail": "Not Found"}`` there).

    The router answers ``{"workers": [{"url": ..., "is_healthy": ..., ...}], "total": n, "stats": {...}}``;
    a worker without ``is_healthy`` counts as healthy.
    """
    if not isinstance(payload, dict) or not isinstance(payload.get("workers"), list):
        return None
    healthy: list[str] = []
    listed: list[str] = []
    for worker in payload["workers"]:
        if not isinstance(worker, dict) or not isinstance(worker.get("url"), str):
            return None
        url = _DP_RANK.sub("", worker["url"]).rstrip("/")
        listed.append(url)
        if worker.get("is_healthy", True):
            healthy.append(url)
    return RouterWorkers(list(dict.fromkeys(healthy)), len(dict.fromkeys(listed)))
