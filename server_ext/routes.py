"""The control routes under ``/agentcache/v1``: end a workflow, a workflow's view, statistics, health.

They sit behind SGLang's API-key middleware like every other route, and reach
the schedulers through the control channel (server_ext/control.py). The
read-only ones (a view, the statistics) are rate-limited per principal, and
the statistics list a page of workflows (server_ext/control_limits.py).
"""

from __future__ import annotations

import math
import time
from typing import Any

from fastapi import Request
from fastapi.responses import ORJSONResponse

from agentcache.server_ext.control import ControlError, control, expiry_ticker
from agentcache.server_ext.control_limits import Page, RateLimiter
from agentcache.server_ext.tenancy import is_operator, tenant_of_request
from agentcache.tags import VERSION, TagError, parse, principal_of


async def _answer(op: str, payload: dict[str, Any]) -> Any:
    """The schedulers' answer to one control operation: rank zero's, or every rank's; 503 if none came."""
    expiry_ticker.start()
    try:
        replies = await control(op, payload)
    except ControlError as exc:
        return ORJSONResponse({"error": str(exc)}, status_code=503)
    return replies[0] if len(replies) == 1 else {"ranks": replies}


def _too_many(limiter: RateLimiter, tenant: str) -> ORJSONResponse | None:
    """429 with Retry-After where the tenant's principal called the read-only routes too often; else None."""
    wait = limiter.take(principal_of(tenant))
    if not wait:
        return None
    retry = max(1, math.ceil(wait))
    return ORJSONResponse(
        {"error": f"too many control calls; {limiter.rate:g} a second are allowed: retry in {retry} s"},
        status_code=429,
        headers={"Retry-After": str(retry)},
    )


def add_routes(app: Any) -> None:
    limiter = RateLimiter.from_env()

    async def end_workflow(workflow_id: str, request: Request) -> Any:
        try:
            parse({"v": VERSION, "workflow": workflow_id, "agent": "-"})
        except TagError as exc:
            return ORJSONResponse({"error": str(exc)}, status_code=400)
        answer = await _answer(
            "end", {"workflow": workflow_id, "tenant": tenant_of_request(request), "ts": time.time()}
        )
        if isinstance(answer, ORJSONResponse):
            return answer
        ranks = answer.get("ranks", [answer])
        return {"workflow": workflow_id, "ended": any(r["ended"] for r in ranks)}

    async def workflow(workflow_id: str, request: Request) -> Any:
        tenant = tenant_of_request(request)
        return _too_many(limiter, tenant) or await _answer("workflow", {"workflow": workflow_id, "tenant": tenant})

    async def stats(request: Request) -> Any:
        try:
            page = Page.parse(request.query_params.get("offset"), request.query_params.get("limit"))
        except ValueError as exc:
            return ORJSONResponse({"error": str(exc)}, status_code=400)
        tenant = tenant_of_request(request)
        payload = {"tenant": tenant, "operator": is_operator(request), "offset": page.offset, "limit": page.limit}
        return _too_many(limiter, tenant) or await _answer("stats", payload)

    async def health(request: Request) -> Any:
        answer = await _answer("ping", {})
        if isinstance(answer, ORJSONResponse):
            return answer
        ranks = answer.get("ranks", [answer])
        return {"status": "ok", "policy": ranks[0]["policy"], "schedulers": len(ranks)}

    # `path`: the server decodes the path before routing, so a workflow id with a "/" (sent as %2F) spans segments.
    app.add_api_route("/agentcache/v1/workflows/{workflow_id:path}/end", end_workflow, methods=["POST"])
    app.add_api_route("/agentcache/v1/workflows/{workflow_id:path}", workflow, methods=["GET"])
    app.add_api_route("/agentcache/v1/stats", stats, methods=["GET"])
    app.add_api_route("/agentcache/v1/health", health, methods=["GET"])
