"""End to end: the real SGLang server on CPU with the plugin, started once for the whole test run."""

from __future__ import annotations

import random
import time
from pathlib import Path

import httpx
import pytest

from agentcache.compiled import Build, pure_requested

pytestmark = pytest.mark.server

VOCAB = 600  # the tiny model's tokenizer has 675 ids; stay clear of the special ones at the top


def ids(seed: str, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(10, VOCAB) for _ in range(n)]


def generate(server, input_ids, tags=None, max_new_tokens=4, headers=None):
    params = {"max_new_tokens": max_new_tokens, "temperature": 0}
    if tags is not None:
        params["custom_params"] = {"agentcache": tags}
    r = server.client.post("/generate", json={"input_ids": input_ids, "sampling_params": params}, headers=headers)
    r.raise_for_status()
    return r.json()["meta_info"]


def stats(server, headers=None):
    r = server.client.get("/agentcache/v1/stats", headers=headers)
    r.raise_for_status()
    return r.json()


def view(server, workflow, headers=None):
    r = server.client.get(f"/agentcache/v1/workflows/{workflow}", headers=headers)
    r.raise_for_status()
    return r.json()


def end(server, workflow, headers=None):
    r = server.client.post(f"/agentcache/v1/workflows/{workflow}/end", headers=headers)
    r.raise_for_status()
    return r.json()


def flush(server):
    """Empties the radix cache (SGLang's own endpoint), so a test starts with no other workflow's nodes."""
    server.client.post("/flush_cache").raise_for_status()
    assert stats(server)["cached_tokens"] == 0


def test_an_ended_workflows_private_nodes_go_before_an_active_ones(server):
    """On an emptied cache, A is the only retired workflow holding nodes."""
    flush(server)
    evicted_before = stats(server)["evicted_tokens"]
    system = ids("sys-evict", 200)
    tags = lambda wf: {"v": 1, "workflow": wf, "agent": "a:evict", "fixed_tokens": 200}  # noqa: E731
    # B first, then A: LRU would evict B's older nodes before A's.
    generate(server, system + ids("hist-B", 700), tags("evict-B"))
    generate(server, system + ids("hist-A", 700), tags("evict-A"))
    assert end(server, "evict-A")["ended"]
    s = stats(server)
    b_held = view(server, "evict-B")["cached_tokens"]
    assert view(server, "evict-A")["cached_tokens"] > 700 and b_held > 700
    # A new request that needs 400 more slots than are free.
    generate(server, ids("fresh-C", s["free_tokens"] + 400), tags("evict-C"), max_new_tokens=1)
    # A keeps only the fixed prompt it shares with B, which B still needs; its private history is gone.
    assert view(server, "evict-A")["cached_tokens"] == 200, "the ended workflow's private nodes were evicted first"
    assert view(server, "evict-B")["cached_tokens"] == b_held, "the active workflow kept its nodes"
    evicted = {k: v - evicted_before.get(k, 0) for k, v in stats(server)["evicted_tokens"].items()}
    assert {k: v for k, v in evicted.items() if v} == {"retired": s["held_tokens"]["retired"]}, (
        "only retired tokens went"
    )
    end(server, "evict-B")
    end(server, "evict-C")


def test_a_workflow_id_with_a_slash_or_in_any_script_is_viewed_and_ended(server):
    """The SDK puts the workflow id in the end event's path percent-encoded (a "/" as %2F); the server decodes
    the path before routing, so an id with a "/" in it matched no route and its end never arrived."""
    from urllib.parse import quote

    for workflow in ("team/run-1", "研究-1"):
        generate(server, ids(f"slash-{workflow}", 40), {"v": 1, "workflow": workflow, "agent": "a:slash"})
        assert view(server, quote(workflow, safe=""))["active"]
        assert end(server, quote(workflow, safe="")) == {"workflow": workflow, "ended": True}


def test_health_and_stats_answer(server):
    health = server.client.get("/agentcache/v1/health", timeout=30).json()
    assert health == {"status": "ok", "policy": "pbkv", "schedulers": 1}
    s = stats(server)
    for key in ("active_workflows", "retired_workflows", "evicted_tokens", "held_tokens", "hit_tokens", "invalid_tags"):
        assert key in s
    # The scheduler runs the policy core the way this checkout has it: compiled where setup built it.
    compiled_here = Build.read().problem is None and not pure_requested()
    assert s["policy_core"] == "compiled (mypyc)" if compiled_here else s["policy_core"].startswith("pure Python")


def test_sglangs_own_gc_freeze_runs_once_the_server_listens(server):
    """CPU dev mode skips SGLang's warm-up, whose freeze then asked before the port was open: a traceback at every
    start and no freeze. SGLang logs "fired up" once its freeze call returned."""
    log = Path(server.opts.log_path)
    deadline = time.monotonic() + 60
    while "The server is fired up and ready to roll!" not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.5)
    start_up, fired_up, _ = log.read_text().partition("The server is fired up and ready to roll!")
    assert fired_up, "SGLang's warm-up thread never finished"
    assert "post-warmup freeze_gc failed" not in start_up and "Traceback" not in start_up


def test_chat_tags_reach_the_nodes_and_the_fixed_prompt_is_its_own_node(server):
    system = {"role": "system", "content": "You are the reviewer agent. Check every claim twice. " * 20}

    def chat(workflow, user):
        body = {
            "model": "default",
            "max_tokens": 4,
            "temperature": 0,
            "messages": [system, {"role": "user", "content": user}],
            "custom_params": {
                "agentcache": {
                    "v": 1,
                    "workflow": workflow,
                    "agent": "a:reviewer",
                    "agent_name": "reviewer",
                    "fixed_messages": 1,
                }
            },
        }
        r = server.client.post("/v1/chat/completions", json=body, timeout=120)
        r.raise_for_status()
        return r.json()["usage"]

    first = chat("chat-1", "Review the plan for task one, please. " * 8)
    w = view(server, "chat-1")
    assert w["active"] and w["requests"] == 1 and w["agents"] == {"reviewer": 1}
    assert w["cached_agents"] == ["reviewer"], "the agent is known by its name, its fingerprint beneath"
    assert 0 < w["cached_fixed_tokens"] < w["cached_tokens"], (
        "the fixed prompt and the dynamic suffix are separate nodes"
    )
    fixed = w["cached_fixed_tokens"]
    # Another workflow of the same agent reuses exactly the fixed prompt (the server split the node there).
    second = chat("chat-2", "A different task entirely, nothing shared. " * 8)
    assert second["prompt_tokens_details"]["cached_tokens"] >= fixed
    assert first["prompt_tokens"] > fixed
    assert end(server, "chat-1") == {"workflow": "chat-1", "ended": True}
    assert end(server, "chat-2")["ended"]
    assert not view(server, "chat-1")["active"]


def test_malformed_and_missing_tags_are_served_and_counted(server):
    before = stats(server)
    prompt = ids("bad-tags", 50)
    bad = {
        "bad_version": {"v": 2, "workflow": "w", "agent": "a"},
        "bad_workflow": {"v": 1, "workflow": "x" * 300, "agent": "a"},
        "bad_agent": {"v": 1, "workflow": "w", "agent": "tab\there"},
        "nested": {"v": 1, "workflow": "w", "agent": "a", "extra": {"deep": 1}},
        "bad_fixed_tokens": {"v": 1, "workflow": "w", "agent": "a", "fixed_tokens": 10_000},
        "not_an_object": "a string",
    }
    for reason, tags in bad.items():
        meta = generate(server, prompt, tags)
        assert meta["prompt_tokens"] == len(prompt), reason
    generate(server, prompt)  # untagged
    after = stats(server)
    for reason in bad:
        assert after["invalid_tags"].get(reason, 0) == before["invalid_tags"].get(reason, 0) + 1, reason
    assert after["untagged_requests"] == before["untagged_requests"] + 1
    assert after["tagged_requests"] == before["tagged_requests"]
    unknown = end(server, "never-started")
    assert unknown == {"workflow": "never-started", "ended": False}
    assert server.client.post("/agentcache/v1/workflows/%09tab/end", timeout=30).status_code == 400


def test_out_of_vocabulary_ids_get_a_clear_error_not_a_dead_server(server):
    body = {"input_ids": [1, 2, 10**6], "sampling_params": {"max_new_tokens": 1}}
    r = server.client.post("/generate", json=body, timeout=60)
    assert r.status_code == 400 and "out-of-vocabulary token id 1000000" in r.text
    assert generate(server, ids("still-alive", 20))["prompt_tokens"] == 20


def test_agentcache_counters_are_on_prometheus_metrics(server):
    text = httpx.get(f"{server.base_url}/metrics", timeout=30).text  # public, as in SGLang
    assert "agentcache_events_total" in text and 'event="tagged_requests"' in text
    assert "agentcache_tokens_total" in text


def test_control_routes_need_the_servers_api_key(server):
    for method, path in (("GET", "stats"), ("GET", "health"), ("GET", "workflows/w"), ("POST", "workflows/w/end")):
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            r = httpx.request(method, f"{server.base_url}/agentcache/v1/{path}", headers=headers, timeout=30)
            assert r.status_code == 401, (path, headers)


def test_tenants_never_see_or_end_each_others_workflows(server):
    alice, bob = {"x-agentcache-tenant": "alice"}, {"x-agentcache-tenant": "bob"}
    tags = {"v": 1, "workflow": "shared-name", "agent": "a:t"}
    generate(server, ids("alice-prompt", 60), tags, headers=alice)
    generate(server, ids("bob-prompt", 60), tags, headers=bob)
    generate(server, ids("bob-prompt-2", 60), {**tags, "tenant": "alice"}, headers=bob)  # a claimed tenant is ignored
    assert view(server, "shared-name", alice)["requests"] == 1
    assert view(server, "shared-name", bob)["requests"] == 2
    assert end(server, "shared-name", bob) == {"workflow": "shared-name", "ended": True}
    assert view(server, "shared-name", alice)["active"], "bob's end event did not end alice's workflow"
    assert not view(server, "shared-name", bob)["active"]
    generate(server, ids("bob-only", 30), {**tags, "workflow": "bob-only"}, headers=bob)
    assert "shared-name" in stats(server, alice)["workflows"]
    assert "bob-only" not in stats(server, alice)["workflows"] and "bob-only" in stats(server, bob)["workflows"]
    assert end(server, "shared-name", alice)["ended"]
    end(server, "bob-only", bob)


def test_requests_without_tags_get_implicit_ones_and_the_same_treatment(server):
    """No SDK at all: each request is a workflow of its own, ended with it, its system prompt its fixed prompt."""
    flush(server)
    before = stats(server)
    system = {"role": "system", "content": "You are a patient support assistant for the billing team. " * 12}

    def chat(user: str) -> dict:
        body = {"model": "default", "max_tokens": 2, "messages": [system, {"role": "user", "content": user}]}
        r = server.client.post("/v1/chat/completions", json=body, timeout=120)
        r.raise_for_status()
        return r.json()["usage"]

    chat("My invoice is wrong, what now? " * 3)
    second = chat("How do I change my card? " * 3)
    after = stats(server)
    assert after["untagged_requests"] - before["untagged_requests"] == 2
    assert after["tagged_requests"] == before["tagged_requests"], "implicit tags are not the client's"
    assert after["retired_workflows"] - before["retired_workflows"] == 2, "each request ended with itself"
    assert after["active_workflows"] == before["active_workflows"]
    assert after["held_tokens"].get("untagged", 0) == 0, "the policy tracks what untagged requests cached"
    assert second["prompt_tokens_details"]["cached_tokens"] > 0
