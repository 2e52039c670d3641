"""Requests their clients abandon, against the real server (issue 55, case 2): SGLang aborts one still in its queue
through `release_aborted_request`, which the plugin did not override, so each left its pending entry behind, a
tagged one a certain read of its agent, and an untagged one its implicit workflow active for the whole lease."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
from test_server_e2e import end, ids, stats

pytestmark = pytest.mark.server

ABANDONED = 1000
WAVE = 250  # connections open at once
TENANT = {"x-agentcache-tenant": "abandoning"}  # its own tenant: its active workflows counted apart


async def abandon(server, n: int) -> int:
    """Send `n` requests, half of them tagged with one workflow, each given up by its client after 50 ms (as
    `curl --max-time 0.05` does). How many the client gave up on."""
    headers = {**server.client.headers, **TENANT}
    timeout = httpx.Timeout(10.0, read=0.05)  # connected and sent; the answer not waited for
    limits = httpx.Limits(max_connections=WAVE, max_keepalive_connections=0)
    gave_up = 0

    async def one(client: httpx.AsyncClient, i: int) -> None:
        nonlocal gave_up
        params = {"max_new_tokens": 64, "temperature": 0, "ignore_eos": True}
        if i % 2:
            params["custom_params"] = {"agentcache": {"v": 1, "workflow": "abandoned", "agent": "a:abandoned"}}
        try:
            await client.post("/generate", json={"input_ids": ids(f"abandoned-{i}", 40), "sampling_params": params})
        except httpx.ReadTimeout:
            gave_up += 1

    async with httpx.AsyncClient(base_url=server.base_url, headers=headers, timeout=timeout, limits=limits) as client:
        for start in range(0, n, WAVE):
            await asyncio.gather(*(one(client, i) for i in range(start, min(n, start + WAVE))))
    return gave_up


def test_a_thousand_abandoned_requests_leave_no_pending_entries_and_no_implicit_workflows(server):
    gave_up = asyncio.run(abandon(server, ABANDONED))
    assert gave_up > ABANDONED // 2, "the clients gave up before most answers came"
    # SGLang notices a gone client within 4 s (_REQUEST_STATE_WAIT_TIMEOUT) and aborts its request.
    deadline, seen, after = time.monotonic() + 90, -1, {}
    while time.monotonic() < deadline:
        time.sleep(2)
        after = stats(server)
        if after.get("in_flight_requests") == 0 and after["requests"] == seen:
            break
        seen = after["requests"]
    mine = stats(server, TENANT)
    assert mine["untagged_requests"] > ABANDONED // 4 and mine["tagged_requests"] > ABANDONED // 4, "they came"
    assert mine["active_workflows"] == 1, "only the tagged workflow is active: no untagged request's own is left"
    assert after.get("in_flight_requests") == 0, "no pending entry left behind"
    assert server.client.get("/health", timeout=30).status_code == 200
    assert end(server, "abandoned", TENANT)["ended"]
