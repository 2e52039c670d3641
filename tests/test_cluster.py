"""Scale-out: the multi-instance replay's routings, and a real two-worker cluster behind sglang-router."""

from __future__ import annotations

import httpx
import pytest

from agentcache.workloads import GenConfig, generate
from agentcache_sdk._cluster import router_workers


@pytest.fixture(scope="module")
def code_retry():
    from agentcache.replay.runner import PreparedTrace

    trace = generate("code-retry", GenConfig(workflows=40, seed=1))
    requests = trace.requests
    return PreparedTrace(trace), sum(r.prompt_tokens for r in requests) / len(requests)


# ---------------------------------------------------------------- multi-instance replay


def test_workflow_affinity_keeps_workflows_whole_and_beats_round_robin(code_retry):
    """At a roomy total capacity (16x the mean prompt over 2 instances) with pbkv.

    Not at every capacity: when an instance cannot hold every agent's fixed prompt,
    round-robin does better (docs/scale-out.md has the whole picture).
    """
    from agentcache.replay.cluster import replay_cluster

    prepared, mean_prompt = code_retry
    runs = replay_cluster(prepared, "pbkv", 2, int(mean_prompt * 8), ["round-robin", "workflow-affinity"])
    by = {r["routing"]: r for r in runs}
    affinity, round_robin = by["workflow-affinity"], by["round-robin"]
    assert affinity["split_workflows"] == 0, "every request of a workflow went to one instance"
    assert round_robin["split_workflows"] > 0
    assert affinity["hit_rate"] > round_robin["hit_rate"] + 0.02
    for run in runs:
        assert run["requests"] == len(prepared.requests) == sum(i["requests"] for i in run["per_instance"])
        assert run["prompt_tokens"] == sum(i["prompt_tokens"] for i in run["per_instance"])
        assert 1.0 <= run["imbalance"] < 1.5
        assert all(0.0 < i["hit_rate"] < 1.0 for i in run["per_instance"])


def test_end_events_reach_every_instance_that_served_the_workflow(code_retry):
    from agentcache.replay.cluster import replay_cluster

    prepared, mean_prompt = code_retry
    (run,) = replay_cluster(prepared, "lru", 3, int(mean_prompt * 4), ["round-robin"])
    assert run["workflows"] == 40 and run["split_workflows"] > 30, "most workflows were served by several instances"
    assert [i["active_workflows"] for i in run["per_instance"]] == [0, 0, 0], "every workflow ends in the trace"


def test_the_prefix_probe_predicts_the_hit_and_changes_nothing(code_retry):
    from agentcache.replay.cluster import Cluster, cached_prefix
    from agentcache.tags import Tags

    prepared, mean_prompt = code_retry
    cluster = Cluster(prepared, "lru", 1, int(mean_prompt * 4), lease_s=300.0)
    cache = cluster.instances[0].cache
    for request, enc in list(zip(prepared.requests, prepared.encoded))[:60]:
        before = (cache.held_tokens(), cache.cache.evictable_size())
        probe = cached_prefix(cache, enc)
        assert cached_prefix(cache, enc) == probe and (cache.held_tokens(), cache.cache.evictable_size()) == before
        tags = Tags(workflow=request.workflow, agent=request.agent, fixed_tokens=enc.fixed_len)
        cache.policy.on_request(tags, request.ts)
        assert cache.serve(enc, tags, request.ts).hit_tokens == probe


def test_bad_routings_and_shapes_are_refused_clearly(code_retry):
    from agentcache.policy import PolicyConfigError
    from agentcache.replay.cluster import RoutingError, parse_routings, replay_cluster

    prepared, _ = code_retry
    assert parse_routings("round-robin, workflow-affinity,round-robin") == ["round-robin", "workflow-affinity"]
    with pytest.raises(RoutingError, match=r"unknown routing 'sticky'; choose from round-robin, prefix-aware"):
        parse_routings("round-robin,sticky")
    with pytest.raises(RoutingError, match="no routing given"):
        parse_routings(" , ")
    with pytest.raises(RoutingError, match="instances must be >= 1, got 0"):
        replay_cluster(prepared, "lru", 0, 8000, ["round-robin"])
    with pytest.raises(RoutingError, match="capacity per instance must be >= 2 tokens"):
        replay_cluster(prepared, "lru", 2, 1, ["round-robin"])
    with pytest.raises(PolicyConfigError, match="unknown policy 'lru,pbkv'"):  # one policy at a time
        replay_cluster(prepared, "lru,pbkv", 2, 8000, ["round-robin"])
    with pytest.raises(PolicyConfigError, match="unknown policy 'nope'"):
        replay_cluster(prepared, "nope", 2, 8000, ["round-robin"])


# ---------------------------------------------------------------- SDK: where end events go


def test_the_routers_worker_list_is_read_and_anything_else_is_not_a_router():
    listing = {
        "workers": [
            {"url": "http://10.0.0.1:30001", "is_healthy": True},
            {"url": "http://10.0.0.2:30001@0", "is_healthy": True},  # --dp-aware: one entry per rank
            {"url": "http://10.0.0.2:30001@1", "is_healthy": True},
            {"url": "http://10.0.0.3:30001", "is_healthy": False},
        ],
        "total": 4,
        "stats": {},
    }
    assert router_workers(listing) == ["http://10.0.0.1:30001", "http://10.0.0.2:30001"]
    assert router_workers({"detail": "Not Found"}) is None
    assert router_workers({"workers": [{"id": 1}]}) is None


def test_end_targets_fall_back_to_the_server_and_cache_the_answer():
    from agentcache_sdk._cluster import end_targets

    calls = []

    def answer(request: httpx.Request) -> httpx.Response:
        calls.append(str(request.url))
        if request.url.host == "router":
            return httpx.Response(200, json={"workers": [{"url": "http://w1:1", "is_healthy": True}], "total": 1})
        return httpx.Response(404, json={"detail": "Not Found"})

    with httpx.Client(transport=httpx.MockTransport(answer)) as client:
        assert end_targets(client, "http://router:1", {}) == ["http://w1:1"]
        assert end_targets(client, "http://plain:1", {}) == ["http://plain:1"]
        assert end_targets(client, "http://router:1", {}) == ["http://w1:1"]
    assert calls == ["http://router:1/workers", "http://plain:1/workers"], "answers are cached per base URL"


# ---------------------------------------------------------------- a real cluster


def test_a_cluster_is_checked_before_anything_starts():
    from agentcache.server_ext.cluster import Cluster, ClusterError, router_command
    from agentcache.server_ext.launcher import ServeOptions

    opts = ServeOptions(model_size="tiny", log_path="/tmp/serve.log")
    c = Cluster(opts, 2, 30000)
    assert c.base_url == "http://127.0.0.1:30000"
    assert c.worker_urls == ["http://127.0.0.1:30001", "http://127.0.0.1:30002"]
    assert [w.opts.log_path for w in c.workers] == ["/tmp/serve.worker0.log", "/tmp/serve.worker1.log"]
    with pytest.raises(ClusterError, match="must all differ"):
        Cluster(opts, 2, 30000, worker_ports=[30000, 30001])
    with pytest.raises(ClusterError, match="2 workers need 2 worker ports, got 1"):
        Cluster(opts, 2, 30000, worker_ports=[30001])
    with pytest.raises(ClusterError, match="workers must be >= 1"):
        Cluster(opts, 0, 30000)
    cmd = router_command(c.worker_urls, host="127.0.0.1", port=30000, metrics_port=29001, api_key="k")
    assert cmd[1:3] == ["-m", "agentcache.server_ext.cluster"]
    for flag in (["--policy", "manual"], ["--prometheus-port", "29001"], ["--api-key", "k"]):
        assert " ".join(flag) in " ".join(cmd)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Two CPU workers (tiny model, pbkv) behind sglang-router on loopback."""
    pytest.importorskip("sglang_router")
    from agentcache.server_ext.cluster import Cluster, free_port
    from agentcache.server_ext.launcher import ServeOptions

    log = tmp_path_factory.mktemp("cluster") / "cluster.log"
    opts = ServeOptions(model_size="tiny", policy="pbkv", max_total_tokens=4000, log_path=str(log))
    c = Cluster(opts, 2, free_port(), worker_ports=[free_port(), free_port()])
    try:
        c.start(timeout_s=600)
    except Exception:
        for path in sorted(log.parent.glob("*.log")):
            print(path.name, path.read_text()[-3000:])
        raise
    yield c
    c.stop()


@pytest.mark.server
def test_the_router_keeps_each_workflow_on_one_worker_and_the_sdk_ends_it_there(cluster):
    import openai

    import agentcache_sdk as ac

    key = "sk-cluster-test"  # workflows are scoped per tenant (the bearer key): the SDK's end events need the same one
    auth = {"Authorization": f"Bearer {key}"}
    previous = (ac.settings.base_url, ac.settings.api_key)
    ac.configure(base_url=cluster.base_url, api_key=key)
    try:
        client = openai.OpenAI(base_url=f"{cluster.base_url}/v1", api_key=key, max_retries=0)
        system = {"role": "system", "content": "You are the planner agent of a code assistant. " * 8}

        @ac.workflow
        def solve(task: str) -> str:
            messages = [system, {"role": "user", "content": task}]
            for step in range(3):
                reply = client.chat.completions.create(model="default", messages=messages, max_tokens=4, temperature=0)
                messages += [
                    {"role": "assistant", "content": reply.choices[0].message.content or "-"},
                    {"role": "user", "content": f"step {step} of {task}: go on"},
                ]
            return ac.current_workflow().id

        def views(workflow: str) -> list[dict]:
            return [
                httpx.get(f"{url}/agentcache/v1/workflows/{workflow}", headers=auth, timeout=30).json()
                for url in cluster.worker_urls
            ]

        workflows = [solve("add a flag"), solve("fix the parser")]
        assert ac.flush(30), "the end events were sent"

        for wf in workflows:
            seen = views(wf)
            assert sorted(v["requests"] for v in seen) == [0, 3], f"{wf}: all 3 requests on one worker: {seen}"
            (home,) = [v for v in seen if v["requests"]]
            assert home["agents"] and home["cached_tokens"] > 0, "the tags in the forwarded header reached the worker"
            assert home["active"] is False, f"{wf} was retired on its worker after the workflow ended"
        stats = [
            httpx.get(f"{url}/agentcache/v1/stats", headers=auth, timeout=30).json() for url in cluster.worker_urls
        ]
        assert sum(s["tagged_requests"] for s in stats) == 6
        assert sum(s["retired_workflows"] for s in stats) == 2
    finally:
        ac.settings.base_url, ac.settings.api_key = previous
