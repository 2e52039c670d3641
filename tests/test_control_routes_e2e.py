"""The read-only control routes against the real server (issue 55, case 7): they list a page of workflows, and a
tenant that calls them faster than the rate limit gets 429 with Retry-After instead of the scheduler's time."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import TENANT_KEYS

pytestmark = pytest.mark.server

# tenant-b's key under a label of its own: its workflow stays out of tenant-b's own list (test_tenants_e2e.py),
# and the label shares the key's bucket.
B = {"Authorization": f"Bearer {TENANT_KEYS['tenant-b']}", "x-agentcache-tenant": "rate-limit"}


def generate(server, workflow, headers=None):
    tags = {"v": 1, "workflow": workflow, "agent": "a:pages"}
    body = {
        "input_ids": [11, 12, 13, 14],
        "sampling_params": {"max_new_tokens": 1, "custom_params": {"agentcache": tags}},
    }
    server.client.post("/generate", json=body, headers=headers).raise_for_status()


def test_statistics_list_a_page_of_workflows_and_check_the_page_asked_for(server):
    """Before, the operator's statistics carried every record (up to 10,000, ~32 MB) and a tenant's scanned every
    active workflow and record, on the scheduler thread. Now a page, most recent first, says where the next starts."""
    for i in range(3):
        generate(server, f"pages-{i}")
    first = server.client.get("/agentcache/v1/stats", params={"limit": 2}).json()
    assert list(first["workflows"]) == ["pages-2", "pages-1"] and first["next_offset"] == 2
    assert first["workflows_total"] >= 3 and first["scope"] == "server" and "held_tokens" in first
    second = server.client.get("/agentcache/v1/stats", params={"limit": 2, "offset": 2}).json()
    assert list(second["workflows"])[0] == "pages-0"
    default = server.client.get("/agentcache/v1/stats").json()
    assert len(default["workflows"]) == min(100, default["workflows_total"])
    for bad in ({"limit": 0}, {"limit": 1001}, {"offset": -1}, {"limit": "many"}):
        r = server.client.get("/agentcache/v1/stats", params=bad)
        assert r.status_code == 400 and "limit" in r.json()["error"], bad


def test_a_tenant_calling_the_read_routes_too_fast_gets_429_with_retry_after(server):
    """Before, any number of concurrent view and statistics calls queued on the scheduler thread, stalling
    decoding for every tenant. Now each principal has a token bucket (20 a second, bursts of 40)."""
    generate(server, "limited", B)

    def view(_: int):
        return server.client.get("/agentcache/v1/workflows/limited", headers=B)

    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(view, range(120)))
    codes = [r.status_code for r in answers]
    assert set(codes) == {200, 429} and codes.count(200) >= 40, codes
    refused = next(r for r in answers if r.status_code == 429)
    retry = int(refused.headers["Retry-After"])
    assert 1 <= retry <= 2 and "too many control calls" in refused.json()["error"]
    other = server.client.get("/agentcache/v1/stats")  # the operator's bucket is its own
    assert other.status_code == 200
    time.sleep(retry)
    assert view(0).status_code == 200, "served again after Retry-After"
    time.sleep(2)  # a full bucket again for the tests that follow
