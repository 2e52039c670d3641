"""The control routes under ``/agentcache/v1``: end a workflow, client events, a workflow's view, statistics, health.

They sit behind SGLang's API-key middleware like every other route (a tenant's key reaches them for its own
workflows: server_ext/tenancy.py), and reach the schedulers through the control channel
(server_ext/control.py). The read-only ones (a view, the statistics) are rate-limited per principal, and the
statistics list a page of workflows; client events (tool calls, plans, the framework's decisions) have a rate of
their own, per event (server_ext/control_limits.py), and a small body (server_ext/client_events.py).
"""

from __future__ import annotations

import math
from typing import Any

from fastapi import Request
from fastapi.responses import ORJSONResponse

from agentcache.server_ext.client_events import MAX_BODY_BYTES, MAX_EVENTS, BatchError, EventCounts, parse_batch
from agentcache.server_ext.control import ControlError, control, expiry_ticker, server_clock
from agentcache.server_ext.control_limits import DEFAULT_EVENT_RATE, EVENT_RATE_ENV, Page, RateLimiter
from agentcache.server_ext.http_limits import BodyTooLarge, read_capped
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


def _too_many(limiter: RateLimiter, tenant: str, what: str = "control calls", cost: int = 1) -> ORJSONResponse | None:
    """429 with Retry-After where the tenant's principal sent `what` faster than `limiter` allows; else None."""
    wait = limiter.take(principal_of(tenant), cost)
    if not wait:
        return None
    retry = max(1, math.ceil(wait))
    return ORJSONResponse(
        {"error": f"too many {what}; {limiter.rate:g} a second are allowed: retry in {retry} s"},
        status_code=429,
        headers={"Retry-After": str(retry)},
    )


def add_routes(app: Any) -> None:
    limiter = RateLimiter.from_env()
    event_limiter = RateLimiter.from_env(EVENT_RATE_ENV, DEFAULT_EVENT_RATE, least_burst=MAX_EVENTS)
    event_counts = EventCounts()

    async def end_workflow(workflow_id: str, request: Request) -> Any:
        try:
            parse({"v": VERSION, "workflow": workflow_id, "agent": "-"})
        except TagError as exc:
            return ORJSONResponse({"error": str(exc)}, status_code=400)
        answer = await _answer(
            "end", {"workflow": workflow_id, "tenant": tenant_of_request(request), "ts": server_clock()}
        )
        if isinstance(answer, ORJSONResponse):
            return answer
        ranks = answer.get("ranks", [answer])
        return {"workflow": workflow_id, "ended": any(r["ended"] for r in ranks)}

    async def client_events(request: Request) -> Any:
        arrived = server_clock()  # the events' time: they happened just now, in the order sent
        tenant = tenant_of_request(request)
        try:
            batch = parse_batch(await read_capped(request, MAX_BODY_BYTES))
        except BodyTooLarge as exc:
            event_counts.count(tenant, "refused", 1)
            return ORJSONResponse({"error": str(exc)}, status_code=413)
        except BatchError as exc:  # nothing of it applied
            event_counts.count(tenant, "refused", exc.events)
            return ORJSONResponse({"error": str(exc)}, status_code=400)
        accepted = len(batch.events)
        if accepted:
            refusal = _too_many(event_limiter, tenant, "events", accepted)
            if refusal is not None:
                event_counts.count(tenant, "refused", accepted + batch.skipped)
                return refusal
            answer = await _answer("tool_events", {"tenant": tenant, "ts": arrived, "events": batch.events})
            if isinstance(answer, ORJSONResponse):
                return answer
        event_counts.count(tenant, "skipped", batch.skipped)
        return {"accepted": accepted, "skipped": batch.skipped}

    async def workflow(workflow_id: str, request: Request) -> Any:
        tenant = tenant_of_request(request)
        return _too_many(limiter, tenant) or await _answer("workflow", {"workflow": workflow_id, "tenant": tenant})

    async def stats(request: Request) -> Any:
        try:
            page = Page.parse(request.query_params.get("offset"), request.query_params.get("limit"))
        except ValueError as exc:
            return ORJSONResponse({"error": str(exc)}, status_code=400)
        tenant, operator = tenant_of_request(request), is_operator(request)
        payload = {
            "tenant": tenant,
            "operator": operator,
            "offset": page.offset,
            "limit": page.limit,
            "tool_events": event_counts.of(tenant, operator),
        }
        return _too_many(limiter, tenant) or await _answer("stats", payload)

    async def health(request: Request) -> Any:
        answer = await _answer("ping", {})
        if isinstance(answer, ORJSONResponse):
            return answer
        ranks = answer.get("ranks", [answer])
        return {"status": "ok", "policy": ranks[0]["policy"], "schedulers": len(ranks)}

    # `path`: the server decodes the path before routing, so a workflow id with a "/" (sent as %2F) spans segments.
    app.add_api_route("/agentcache/v1/workflows/{workflow_id:path}/end", end_workflow, methods=["POST"])
    app.add_api_route("/agentcache/v1/events", client_events, methods=["POST"])
    app.add_api_route("/agentcache/v1/workflows/{workflow_id:path}", workflow, methods=["GET"])
    app.add_api_route("/agentcache/v1/stats", stats, methods=["GET"])
    app.add_api_route("/agentcache/v1/health", health, methods=["GET"])
