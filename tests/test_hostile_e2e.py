"""A hostile client against the real server: nothing it sends may take the server down or reach another tenant.

Each refused shape below crashed SGLang 0.5.23's scheduler (and with it every process of the server)
before the plugin refused it; each test checks that the server still serves afterwards.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import psutil
import pytest
from test_server_e2e import generate, ids, stats, view

pytestmark = pytest.mark.server

CRASHING = {
    "an empty prompt alone in a batch": (
        {"input_ids": [[]], "sampling_params": {"max_new_tokens": 2}},
        "input_ids[0] is empty",
    ),
    "an empty prompt in a batch, one sampling-params object each": (
        {"input_ids": [[]], "sampling_params": [{"max_new_tokens": 2}]},
        "input_ids[0] is empty",
    ),
    "an empty prompt beside a real one": (
        {"input_ids": [[5, 6], []], "sampling_params": {"max_new_tokens": 2}},
        "input_ids[1] is empty",
    ),
    "more top log-probabilities than the vocabulary has": (
        {"input_ids": [5, 6], "return_logprob": True, "top_logprobs_num": 100_000, "sampling_params": {}},
        "top_logprobs_num 100000 exceeds",
    ),
    "the same, per prompt of a batch": (
        {"input_ids": [[5, 6]], "return_logprob": [True], "top_logprobs_num": [100_000], "sampling_params": {}},
        "top_logprobs_num 100000 exceeds",
    ),
    "an out-of-vocabulary id inside a batch": (
        {"input_ids": [[5, 6], [7, 10**6]], "sampling_params": {"max_new_tokens": 2}},
        "input_ids[1] contains out-of-vocabulary token id 1000000",
    ),
}


@pytest.mark.parametrize("shape", sorted(CRASHING))
def test_a_prompt_the_engine_would_crash_on_is_refused_and_the_server_keeps_serving(server, shape):
    body, message = CRASHING[shape]
    r = server.client.post("/generate", json=body, timeout=60)
    assert r.status_code == 400 and message in r.text, r.text
    assert generate(server, ids(f"alive-after-{shape}", 20))["prompt_tokens"] == 20


def test_the_empty_prompt_check_sees_prompts_as_tokenized():
    """Text can tokenize to nothing (an empty string, where the tokenizer adds no BOS token)."""
    from sglang.srt.managers.io_struct import GenerateReqInput

    from agentcache.server_ext.guards import before_validate

    with pytest.raises(ValueError, match="the prompt is empty"):
        before_validate(None, GenerateReqInput(text=""), [])
    before_validate(None, GenerateReqInput(text="", session_params={"id": "s"}), [])  # a session supplies it
    before_validate(None, GenerateReqInput(text="x"), [7])


NASTY_HEADERS = {
    "2,000 nested brackets": "[" * 2000 + "]" * 2000,
    "100,000 nested objects": '{"a":' * 100_000 + "1" + "}" * 100_000,
    "not JSON": "{not json at all",
    "8 kB of one string": '"' + "x" * 8000 + '"',
}


def test_every_malformed_tag_header_is_served_untagged_and_counted(server):
    before = stats(server)["invalid_tags"]
    body = {"model": "default", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 2}
    for name, header in NASTY_HEADERS.items():
        r = server.client.post(
            "/v1/chat/completions", json=body, headers={"x-request-id-agentcache": header}, timeout=60
        )
        assert r.status_code == 200, (name, r.text[:200])
    after = stats(server)["invalid_tags"]
    counted = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    assert counted.get("bad_header", 0) == 3 and counted.get("not_an_object", 0) == 1, counted


def _scheduler(server) -> psutil.Process:
    (scheduler,) = [
        p for p in psutil.Process(server.process.pid).children(recursive=True) if "scheduler" in " ".join(p.cmdline())
    ]
    return scheduler


def test_a_late_control_reply_never_answers_another_tenants_call(server):
    """A's call times out while the scheduler is stalled; B asks next and must get B's record, not A's."""
    from conftest import CONTROL_TIMEOUT_S

    alice, bob = {"x-agentcache-tenant": "stall-alice"}, {"x-agentcache-tenant": "stall-bob"}
    generate(server, ids("stall-a", 40), {"v": 1, "workflow": "stall-a", "agent": "a:alice"}, headers=alice)
    generate(server, ids("stall-b", 40), {"v": 1, "workflow": "stall-b", "agent": "a:bob"}, headers=bob)
    scheduler = _scheduler(server)
    scheduler.suspend()  # a long GC pause or a stuck kernel, as far as the HTTP process can tell
    try:
        started = time.monotonic()
        r = server.client.get("/agentcache/v1/workflows/stall-a", headers=alice, timeout=60)
        assert r.status_code == 503 and time.monotonic() - started >= CONTROL_TIMEOUT_S - 1
        with ThreadPoolExecutor(1) as pool:
            asked = pool.submit(server.client.get, "/agentcache/v1/workflows/stall-b", headers=bob, timeout=60)
            time.sleep(1.0)
            scheduler.resume()  # the scheduler now answers A's call first, then B's
            answer = asked.result()
    finally:
        scheduler.resume()
    assert answer.status_code == 200
    record = answer.json()
    assert record["workflow"] == "stall-b" and record["agents"] == {"a:bob": 1}, record
    assert view(server, "stall-a", alice)["agents"] == {"a:alice": 1}
    for workflow, who in (("stall-a", alice), ("stall-b", bob)):
        assert server.client.post(f"/agentcache/v1/workflows/{workflow}/end", headers=who).json()["ended"]


def test_stats_show_a_tenant_only_its_own_traffic(server):
    carol = {"x-agentcache-tenant": "carol"}
    generate(server, ids("carol-1", 30), {"v": 1, "workflow": "carol-wf", "agent": "a:carol"}, headers=carol)
    generate(server, ids("carol-2", 30), headers=carol)  # untagged, still carol's
    own = stats(server, carol)
    assert own["scope"] == "tenant"
    assert own["tagged_requests"] == 1 and own["untagged_requests"] == 1 and own["requests"] == 2
    assert own["active_workflows"] == 1 and list(own["workflows"]) == ["carol-wf"]
    for server_wide in ("held_tokens", "evicted_tokens", "cached_tokens", "free_tokens", "retired_workflows"):
        assert server_wide not in own
    operator = stats(server)
    assert operator["scope"] == "server" and operator["tagged_requests"] > own["tagged_requests"]
    with httpx.Client(base_url=server.base_url) as anonymous:  # a key the server does not know gets nothing
        assert anonymous.get("/agentcache/v1/stats", headers={"Authorization": "Bearer nope"}).status_code == 401
    server.client.post("/agentcache/v1/workflows/carol-wf/end", headers=carol).raise_for_status()
