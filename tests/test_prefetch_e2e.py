"""End to end with SGLang's host tier on CPU: a prefetched node serves a later request from device memory."""

from __future__ import annotations

import random
import time

import httpx
import pytest

pytestmark = pytest.mark.server

CAPACITY = 3000
KEY = "prefetch-key"


def ids(seed: str, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(10, 600) for _ in range(n)]


@pytest.fixture(scope="module")
def hicache(tmp_path_factory):
    from agentcache.server_ext.launcher import ServeOptions, Server, free_port

    log = tmp_path_factory.mktemp("hicache") / "sglang.log"
    opts = ServeOptions(
        model_size="tiny",
        policy="pbkv",
        port=free_port(),
        max_total_tokens=CAPACITY,
        hicache=True,
        api_key=KEY,
        log_path=str(log),
    )
    with Server(opts) as srv:
        srv.client = httpx.Client(base_url=srv.base_url, headers={"Authorization": f"Bearer {KEY}"}, timeout=120)
        yield srv
        srv.client.close()


def generate(server, input_ids, workflow=None, max_new_tokens=4):
    params = {"max_new_tokens": max_new_tokens, "temperature": 0}
    if workflow:
        params["custom_params"] = {"agentcache": {"v": 1, "workflow": workflow, "agent": "a:pf", "fixed_tokens": 200}}
    r = server.client.post("/generate", json={"input_ids": input_ids, "sampling_params": params})
    r.raise_for_status()
    return r.json()


def test_a_prefetched_node_serves_a_later_request_from_device_with_the_same_output(hicache):
    system, history = ids("pf-sys", 200), ids("pf-history", 600)
    first = generate(hicache, system + history, "pf-W")
    # Another workflow's large requests push W's cache out to the host tier.
    for i in range(2):
        generate(hicache, ids(f"pf-filler-{i}", CAPACITY - 300), "pf-F", max_new_tokens=1)
    assert hicache.client.get("/agentcache/v1/workflows/pf-W").json()["cached_tokens"] < 800, (
        "W's history left the device"
    )
    # F ends: its cache is retired, i.e. idle space a conservative prefetch may use.
    assert hicache.client.post("/agentcache/v1/workflows/pf-F/end").json()["ended"]
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        stats = hicache.client.get("/agentcache/v1/stats").json()
        if stats["prefetch"]["prefetched_tokens"] >= 600:
            break
        time.sleep(0.5)
    assert stats["prefetch"]["prefetched_tokens"] >= 600, stats["prefetch"]
    follow_up = system + history + first["output_ids"] + ids("pf-turn-2", 40)
    second = generate(hicache, follow_up, "pf-W", max_new_tokens=8)
    details = second["meta_info"].get("cached_tokens_details") or {}
    assert second["meta_info"]["cached_tokens"] >= 800
    assert details.get("host", 0) == 0, f"served from device, not reloaded at admission: {details}"
    used = hicache.client.get("/agentcache/v1/stats").json()["prefetch"]["used_tokens"]
    assert used >= 600
    # The same prompt computed from scratch gives the same text: the prefetched KV is intact.
    assert hicache.client.post("/flush_cache").status_code == 200
    again = generate(hicache, follow_up, max_new_tokens=8)
    assert again["meta_info"]["cached_tokens"] == 0
    assert again["text"] == second["text"]
