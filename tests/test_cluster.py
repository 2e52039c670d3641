"""Scale-out: the multi-instance replay's routings, and a real two-worker cluster behind sglang-router."""

from __future__ import annotations

import json
from collections import Counter

import httpx
import pytest

from agentcache.router_workers import RouterWorkers, parse_router_workers
from agentcache.workloads import GenConfig, generate


@pytest.fixture(scope="module")
def code_retry():
    from agentcache.replay.runner import PreparedTrace

    trace = generate("code-retry", GenConfig(workflows=40, seed=1))
    requests = trace.requests
    return PreparedTrace(trace), sum(r.prompt_tokens for r in requests) / len(requests)


# ---------------------------------------------------------------- several workers in the timed replay


def test_workflow_affinity_keeps_workflows_whole_and_beats_round_robin(code_retry):
    """At a roomy total capacity (16x the mean prompt over 2 workers) with pbkv, at the trace's own pace."""
    from agentcache.replay.scale_out import replay_cluster

    prepared, mean_prompt = code_retry
    runs = replay_cluster(prepared, "pbkv", 2, int(mean_prompt * 8), ["round-robin", "workflow-affinity"])
    by = {r["routing"]: r for r in runs}
    affinity, round_robin = by["workflow-affinity"], by["round-robin"]
    assert affinity["split_workflows"] == 0, "every request of a workflow went to one worker"
    assert round_robin["split_workflows"] > 0
    assert affinity["hit_rate"] > round_robin["hit_rate"] + 0.02
    for run in runs:
        assert run["requests"] == len(prepared.requests) == sum(i["requests"] for i in run["per_instance"])
        assert run["prompt_tokens"] == sum(i["prompt_tokens"] for i in run["per_instance"])
        assert 1.0 <= run["imbalance"] < 1.5
        assert all(0.0 < i["hit_rate"] < 1.0 for i in run["per_instance"])


def test_workflow_affinity_places_a_new_workflow_where_fewest_routing_keys_are_in_flight():
    """sglang-router 0.3.2's min_group counts the keys with a request in flight (WorkerRoutingKeyLoad), not the
    keys it ever placed: a worker whose workflows are all between requests takes the next new one."""
    from agentcache.replay.routers import InFlight, ManualPolicy
    from agentcache.replay.scheduler import Served

    in_flight = InFlight(2)
    manual = ManualPolicy(in_flight)

    def send(key: str, finished: float) -> int:
        worker = manual.route(key)
        in_flight.sent(worker, key)
        in_flight.answered(
            Served(
                index=0, workflow=key, worker=worker, arrival=0.0, prompt_tokens=1, output_tokens=1, finished=finished
            ),
            key,
        )
        return worker

    manual.worker_of["wf-a"] = 0  # a key the router placed on worker 0 earlier
    assert send("wf-a", finished=10.0) == 0
    assert send("wf-b", finished=1.0) == 1, "a new key goes where no key is in flight"
    in_flight.advance(2.0)  # wf-b answered, wf-a still running
    assert in_flight.keys == [Counter({"wf-a": 1}), Counter()]
    # Each worker holds one key ever placed (counting those, a tie); in flight, worker 0 holds one, worker 1 none.
    assert send("wf-c", finished=3.0) == 1
    assert manual.route("wf-a") == 0 and manual.route("wf-b") == 1, "a key keeps its worker"
    in_flight.advance(20.0)
    assert in_flight.load == [0, 0] and in_flight.keys == [Counter(), Counter()]


def test_end_events_reach_every_worker_that_served_the_workflow(code_retry):
    from agentcache.replay.scale_out import replay_cluster

    prepared, mean_prompt = code_retry
    for routing in ("round-robin", "workflow-aware"):
        (run,) = replay_cluster(prepared, "lru", 3, int(mean_prompt * 4), [routing], lease_s=1e9)
        assert run["workflows"] == 40 and run["split_workflows"] > 20, "most workflows were served by several workers"
        # the lease never runs out: a workflow is retired on a worker only by its end event
        assert [i["active_workflows"] for i in run["per_instance"]] == [0, 0, 0], "every workflow ends in the trace"


def test_the_timed_fields_are_present_and_sane(code_retry):
    from agentcache.replay.scale_out import ROUTINGS, replay_cluster

    prepared, mean_prompt = code_retry
    relaxed = replay_cluster(prepared, "lru", 2, int(mean_prompt * 8), ROUTINGS)
    loaded = replay_cluster(prepared, "lru", 2, int(mean_prompt * 8), ROUTINGS, time_scale=0.05)
    assert [r["routing"] for r in relaxed] == list(ROUTINGS)
    for calm, busy in zip(relaxed, loaded):
        for run in (calm, busy):
            assert 0.0 < run["ttft_p50_s"] <= run["ttft_p90_s"] <= run["ttft_p99_s"] < 120.0
            assert run["latency_p50_s"] >= run["ttft_p50_s"]
            assert run["throughput_rps"] > 0 and 0.0 < run["utilization"] <= 1.0
            assert run["requests"] == len(prepared.requests)
            for i in run["per_instance"]:
                assert {"ttft_p50_s", "ttft_p90_s", "throughput_rps", "utilization"} <= i.keys()
        # twenty times the arrival rate: the workers are busier and requests wait longer
        assert busy["utilization"] > calm["utilization"]
        assert busy["throughput_rps"] > calm["throughput_rps"]
        assert busy["ttft_p90_s"] > calm["ttft_p90_s"], busy["routing"]


def _requests(*prompts: tuple[str, tuple[tuple[str, int], ...]]):
    """(agent, segments) -> trace requests and their encodings, one workflow each unless named."""
    from agentcache.replay.tokens import TokenCodec
    from agentcache.trace import Request, Segment

    codec = TokenCodec()
    out = []
    for i, (agent, segments) in enumerate(prompts):
        request = Request(float(i), f"wf{i}", agent, tuple(Segment(c, t) for c, t in segments), 1, 10)
        out.append((request, codec.encode(request, i)))
    return out


def test_cache_aware_follows_the_longest_prefix_until_the_balance_thresholds_trip():
    from agentcache.replay.cache_aware import CacheAware

    sys_a, sys_b = ("sys-a", 400), ("sys-b", 400)
    (a1, ea1), (b1, eb1), (a2, ea2), (a3, ea3), (new, enew) = _requests(
        ("a", (sys_a, ("task1", 100))),
        ("b", (sys_b, ("task2", 100))),
        ("a", (sys_a, ("task3", 100))),  # 400 of 500 tokens cached on a's worker: 80% > 30%
        ("a", (sys_a, ("task4", 2000))),  # 400 of 2400: 17% < 30%: the worker with the smaller tree
        ("c", (("sys-c", 50), ("task5", 50))),
    )
    router = CacheAware(2)
    assert router(a1, ea1, [], 0.0) == 0, "nothing matches: the smallest tree (both empty: the first)"
    assert router(b1, eb1, [], 0.0) == 1, "nothing matches: the smallest tree"
    assert router.tree.size == [500, 500]
    assert router(a2, ea2, [], 0.0) == 0, "the longest prefix, past the cache threshold"
    assert router.tree.size == [600, 500]
    assert router(a3, ea3, [], 0.0) == 1, "a match under the threshold: the smallest tree"

    # loads: requests sent and not answered. 40 and 70 in flight: max - min = 30 <= 64, balanced
    router.in_flight.load = [70, 40]
    assert router(a2, ea2, [], 1.0) == 0, "balanced: still the prefix"
    router.in_flight.load = [110, 40]  # 110 - 40 = 70 > 64 but 110 < 1.5 x 40 = 60? no: 110 > 60: imbalanced
    assert router(a2, ea2, [], 2.0) == 1, "imbalanced: the least loaded, prefix or not"
    router.in_flight.load = [200, 140]  # 60 apart: under the absolute threshold
    assert router(a2, ea2, [], 3.0) == 0
    router.in_flight.load = [300, 210]  # 90 apart but 300 < 1.5 x 210: under the relative threshold
    assert router(a2, ea2, [], 4.0) == 0
    router.in_flight.load = [0, 65]
    assert router(new, enew, [], 5.0) == 0, "imbalanced the other way: the least loaded"
    assert router.tree.match(enew.prompt_chains, [50, 50], 6.0) == (100, 0), "and the tree learnt where it went"


def test_the_router_tree_evicts_least_recently_used_leaves_per_worker():
    from agentcache.replay.cache_aware import ApproximateTree

    (_, e1), (_, e2) = _requests(("a", (("sys", 100), ("t1", 50))), ("a", (("sys", 100), ("t2", 50))))
    tree = ApproximateTree(1, max_tokens=160)
    tree.insert(e1.prompt_chains, [100, 50], 0, now=1.0)
    tree.insert(e2.prompt_chains, [100, 50], 0, now=2.0)
    assert tree.size == [200]
    tree.evict()
    assert tree.size == [150], "the older leaf went; the shared prefix stays"
    assert tree.match(e1.prompt_chains, [100, 50], 3.0) == (100, 0)
    assert tree.match(e2.prompt_chains, [100, 50], 3.0) == (150, 0)


def test_workflow_aware_keeps_conversations_and_agents_together_within_its_bound():
    from agentcache.routing import WorkflowAwareRouting

    routing = WorkflowAwareRouting(4, max_imbalance=1.5, slack=8, headroom=0.75, half_life=1e9)
    agents = ("planner", "coder", "tester", "analyzer")
    for i in range(50):
        for agent in agents:
            routing.answered(routing.choose(f"warm{i}", agent, 3000, 2000))
    homes = sorted(s for a in agents for s in routing.agent_slots[a])
    assert homes == [0, 1, 2, 3], f"equal traffic: a home each, on different slots: {homes}"
    (home,) = routing.agent_slots["coder"]

    first = routing.choose("w1", "coder", 3000, 2000)
    assert first.slot == home and first.new_tokens == 1000, "a new conversation goes where its agent's prompt is"
    again = routing.choose("w1", "coder", 3500, 2000)
    assert again.slot == home and again.new_tokens == 500, "the conversation's history is where it went"
    routing.answered(first)
    routing.answered(again)
    assert [s.in_flight for s in routing.slots] == [0, 0, 0, 0]

    # A burst of the coder's requests, none answered: its home fills to the bound, then they spill.
    placements = [routing.choose(f"x{i}", "coder", 2500, 2000) for i in range(12)]
    loads = [s.in_flight for s in routing.slots]
    assert routing.agent_slots["coder"] == [home], "spilt requests do not make a slot a home"
    # the bound is the least loaded slot's count + 8: 8 while the others are idle, 9 once each holds one
    assert loads[home] == 9 and sorted(loads) == [1, 1, 1, 9], loads
    for p in placements:
        routing.answered(p)
    assert routing.ended("w1") == {home} and routing.ended("w1") == set()

    # One agent with all the traffic is homed everywhere.
    routing = WorkflowAwareRouting(2)
    routing.answered(routing.choose("w", "solo", 1000, 800))
    assert routing.agent_slots["solo"] == [0, 1]

    # A client whose workflows are single requests names the thread instead: it stays where it was.
    routing = WorkflowAwareRouting(2)
    first = routing.choose("request-1", "assistant", 1000, 800, conversation="chat-7")
    routing.choose("request-2", "assistant", 1000, 800, conversation="chat-8")  # busies the other slot
    routing.answered(first)
    later = routing.choose("request-3", "assistant", 1500, 800, conversation="chat-7")
    assert later.slot == first.slot and later.new_tokens == 500
    assert routing.ended("request-1") == {first.slot}


def test_workflow_aware_keeps_a_conversation_where_its_history_is_whatever_prefill_waits_there():
    """The score took off 0.1 x the prefill in flight on a slot, so one long prompt queued there sent the
    conversation's next turn elsewhere, to compute its whole history again, though the slot was far within the
    bound on requests in flight. The bound is what spreads load; the score is the prefill a slot saves."""
    from agentcache.routing import WorkflowAwareRouting

    routing = WorkflowAwareRouting(2, half_life=1e9)
    first = routing.choose("w", "solo", 4000, 500)
    routing.answered(first)
    assert routing.agent_slots["solo"] == [0, 1] and first.slot == 0  # all the traffic: homed on both slots
    # Another conversation's long prompt goes to slot 0 too (a tie: the same fixed prompt, nothing in flight).
    assert routing.choose("other", "solo", 200_000, 500).slot == 0
    turn = routing.choose("w", "solo", 4500, 500)
    assert turn.slot == 0 and turn.new_tokens == 500, "the next turn reads its history where it is"


def test_workflow_aware_gives_an_agent_its_share_of_the_slots_rounded_to_the_nearest():
    """Three agents with equal traffic on four slots each need 1.33 slots: one home each, on three different
    slots, not two each (six copies of fixed prompts on four slots, every agent's conversations split)."""
    from agentcache.routing import WorkflowAwareRouting

    routing = WorkflowAwareRouting(4, half_life=1e9)
    agents = ("planner", "coder", "tester")
    for i in range(30):
        for agent in agents:
            routing.answered(routing.choose(f"w{i}", agent, 3000, 2000))
    homes = [routing.agent_slots[a] for a in agents]
    assert all(len(h) == 1 for h in homes), homes
    assert len({h[0] for h in homes}) == 3, f"each on its own slot: {homes}"
    # An agent with half the traffic on three slots (1.5) gets two; halves round up.
    routing = WorkflowAwareRouting(3, half_life=1e9)
    for i in range(30):
        for agent in ("coder", "coder", "planner", "tester"):
            routing.answered(routing.choose(f"w{i}", agent, 3000, 2000))
    assert len(routing.agent_slots["coder"]) == 2 and len(routing.agent_slots["planner"]) == 1


def test_workflow_aware_sizes_homes_by_kv_occupancy_learned_from_the_answers_not_by_prompt_tokens():
    """A group chat's speaker selector re-reads a long prompt to write a few tokens; the coder writes hundreds.
    Homes follow the KV memory each occupies (what it holds times how long it runs, with each agent's output
    learned from the answers), so the selector, with twice the requests and prompt tokens, keeps one home and
    the coder gets them all; with no output lengths reported, only the prompts' prefill holds memory."""
    from agentcache.routing import WorkflowAwareRouting

    def warm(routing, report_output):
        for i in range(60):
            for agent, output in (("selector", 4), ("selector", 4), ("coder", 400)):
                placement = routing.choose(f"w{i}", agent, 3000, 2000)
                routing.answered(placement, output if report_output else None)

    routing = WorkflowAwareRouting(4, half_life=1e9)
    warm(routing, report_output=True)
    assert routing.expected_output("coder") == pytest.approx(400) and routing.expected_output("selector") == 4
    assert routing.expected_output("newcomer") == pytest.approx(136, abs=1), "every agent's mean until its own"
    assert len(routing.agent_slots["selector"]) == 1 and len(routing.agent_slots["coder"]) == 4

    unreported = WorkflowAwareRouting(4, half_life=1e9)
    warm(unreported, report_output=False)
    assert len(unreported.agent_slots["selector"]) == 3 and len(unreported.agent_slots["coder"]) == 1

    # An answer without usage (a stream, an error) teaches nothing; a half-life under one request is refused.
    routing.answered(routing.choose("w-stream", "coder", 3000, 2000))
    assert routing.expected_output("coder") == pytest.approx(400)
    with pytest.raises(ValueError, match="half_life must be >= 1 request"):
        WorkflowAwareRouting(2, half_life=0.5)


def test_workflow_aware_on_a_small_busy_cluster(code_retry):
    """code-retry, 40 workflows at 4x their pace, 2 workers of 4x the mean prompt each, lru: workflow-aware
    caches more than pinning workflows and keeps load within its bound (it does not beat cache-aware on
    every figure: docs/results/scale-out.md)."""
    from agentcache.replay.scale_out import replay_cluster

    prepared, mean_prompt = code_retry
    runs = replay_cluster(
        prepared,
        "lru",
        2,
        int(mean_prompt * 4),
        ["cache-aware", "workflow-affinity", "workflow-aware"],
        time_scale=0.25,
    )
    by = {r["routing"]: r for r in runs}
    aware = by["workflow-aware"]
    assert aware["hit_rate"] > by["workflow-affinity"]["hit_rate"] + 0.02
    assert aware["hit_rate"] > by["cache-aware"]["hit_rate"] - 0.1
    assert aware["imbalance"] < 1.3 and aware["split_workflows"] > 0, "agents, not workflows, are kept together"


def test_bad_routings_and_shapes_are_refused_clearly(code_retry):
    from agentcache.policy import PolicyConfigError
    from agentcache.replay.scale_out import RoutingError, parse_routings, replay_cluster

    prepared, _ = code_retry
    assert parse_routings("round-robin, workflow-aware,round-robin") == ["round-robin", "workflow-aware"]
    with pytest.raises(
        RoutingError,
        match=r"unknown routing 'sticky'; choose from round-robin, power-of-two, cache-aware, workflow-affinity, "
        "workflow-aware",
    ):
        parse_routings("round-robin,sticky")
    with pytest.raises(RoutingError, match="unknown routing 'prefix-aware'"):
        parse_routings("prefix-aware")
    with pytest.raises(RoutingError, match="no routing given"):
        parse_routings(" , ")
    with pytest.raises(RoutingError, match="instances must be >= 1, got 0"):
        replay_cluster(prepared, "lru", 0, 8000, ["round-robin"])
    with pytest.raises(RoutingError, match="capacity per instance must be >= 2 tokens"):
        replay_cluster(prepared, "lru", 2, 1, ["round-robin"])
    with pytest.raises(RoutingError, match="time scale must be > 0, got 0"):
        replay_cluster(prepared, "lru", 2, 8000, ["round-robin"], time_scale=0)
    with pytest.raises(PolicyConfigError, match="unknown policy 'lru,pbkv'"):  # one policy at a time
        replay_cluster(prepared, "lru,pbkv", 2, 8000, ["round-robin"])
    with pytest.raises(PolicyConfigError, match="unknown policy 'nope'"):
        replay_cluster(prepared, "nope", 2, 8000, ["round-robin"])
    with pytest.raises(PolicyConfigError, match="prefetch variants"):
        replay_cluster(prepared, "pbkv+prefetch", 2, 8000, ["round-robin"])


def test_cli_replay_with_instances_reports_the_timed_figures(tmp_path, capsys, monkeypatch):
    import json

    from agentcache.cli import main
    from agentcache.trace import write_trace

    path = tmp_path / "t.jsonl"
    write_trace(path, generate("code-retry", GenConfig(workflows=8, seed=2)))
    argv = ["replay", str(path), "--capacity", "16000", "--policy", "lru", "--instances", "2"]
    assert main([*argv, "--routing", "cache-aware,workflow-aware", "--time-scale", "0.5", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert [r["routing"] for r in rows] == ["cache-aware", "workflow-aware"]
    for row in rows:
        for key in ("hit_rate", "imbalance", "split_workflows", "per_instance", "ttft_p50_s", "ttft_p90_s"):
            assert key in row
        assert row["throughput_rps"] > 0 and row["capacity"] == 16000 and row["instances"] == 2
        assert row["time_scale"] == 0.5
        assert row["forecaster"] is None  # each policy's own
    pbkv_argv = [*argv[:-3], "pbkv", "--instances", "2", "--routing", "round-robin", "--predictor", "markov"]
    assert main([*pbkv_argv, "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert row["forecaster"] == "markov", "the JSON says whose forecasts these were, as the table does"
    # The table in an 80-column terminal: names whole, numbers squeezed (rich cut "workflow-a…" before).
    monkeypatch.setenv("COLUMNS", "80")
    routings = "power-of-two,workflow-affinity,workflow-aware"
    table_argv = [*argv[:-3], "pbkv/-fixed-by-forecast", "--instances", "2", "--routing", routings]
    assert main(table_argv) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in [*routings.split(","), "pbkv/-fixed-by-forecast"]), out
    assert main([*argv, "--routing", "round-robin,sticky"]) == 2
    assert "--routing: unknown routing 'sticky'" in capsys.readouterr().err
    assert main([*argv, "--time-scale", "0"]) == 2
    assert "--time-scale must be > 0" in capsys.readouterr().err


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
    assert parse_router_workers(listing) == RouterWorkers(["http://10.0.0.1:30001", "http://10.0.0.2:30001"], 3)
    assert parse_router_workers({"detail": "Not Found"}) is None
    assert parse_router_workers({"workers": [{"id": 1}]}) is None


def test_end_targets_fall_back_to_the_server_and_cache_the_answer():
    from agentcache_sdk._workers import end_targets

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
    from agentcache.server_ext.launcher import ServeOptions
    from agentcache.server_ext.router import Cluster, ClusterError
    from agentcache.server_ext.router_process import router_command

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
    assert cmd[1:3] == ["-m", "agentcache.server_ext.router_process"]
    for flag in (["--policy", "manual"], ["--prometheus-port", "29001"], ["--api-key", "k"]):
        assert " ".join(flag) in " ".join(cmd)


def test_a_cluster_stops_its_router_and_workers_at_once_within_one_grace_period():
    """Ctrl-C on `agentcache serve --workers N`: the router and the workers each drain for up to the grace
    period together, so a stop whose processes all take their full grace still ends in one grace period."""
    import subprocess
    import sys
    import time

    from agentcache.server_ext.launcher import ServeOptions
    from agentcache.server_ext.router import Cluster

    draining = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(60)"
    )

    def slow_to_stop() -> subprocess.Popen:
        process = subprocess.Popen(
            [sys.executable, "-c", draining], stdout=subprocess.PIPE, text=True, start_new_session=True
        )
        assert process.stdout.readline() == "ready\n"  # SIGTERM is ignored from here on
        return process

    c = Cluster(ServeOptions(model_size="tiny"), 2, 30000)
    c.router = slow_to_stop()
    processes = [c.router]
    for worker in c.workers:
        worker.process = slow_to_stop()
        processes.append(worker.process)
    grace_s = 2.0
    started = time.monotonic()
    c.stop(grace_s=grace_s)
    assert time.monotonic() - started < 1.5 * grace_s
    assert all(p.poll() is not None for p in processes) and c.router is None


def test_a_free_port_is_below_the_kernels_ephemeral_range():
    """A port from the ephemeral range can go to an outgoing connection before the server binds it: one CI run
    lost a test to "address already in use" on a port bind(0) had handed out."""
    from pathlib import Path

    from agentcache.server_ext.launcher import free_port

    ephemeral_low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    assert all(free_port() < ephemeral_low for _ in range(50))


def test_a_port_a_server_just_left_is_free_and_one_a_server_listens_on_is_not():
    import socket

    from agentcache.server_ext.launcher import free_port, port_is_free

    port = free_port()
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn and SGLang bind
    server.bind(("127.0.0.1", port))
    server.listen()
    client = socket.create_connection(("127.0.0.1", port))
    accepted, _ = server.accept()
    assert not port_is_free("127.0.0.1", port)
    accepted.close()  # the server closes first, as one that stops does: its side waits out TIME_WAIT
    client.close()
    server.close()
    # A restarted server could listen here again at once; a check that said "in use" would stop the cluster.
    assert port_is_free("127.0.0.1", port)


def test_the_slot_keys_are_placed_one_per_worker_or_the_cluster_fails(monkeypatch):
    from agentcache.server_ext import router as router_module
    from agentcache.server_ext.launcher import ServeOptions
    from agentcache.server_ext.router import Cluster, ClusterError
    from agentcache.server_ext.router_process import routing_keys_active

    metrics = """# TYPE smg_worker_routing_keys_active gauge
smg_worker_routing_keys_active{worker="http://127.0.0.1:30001"} 1
smg_worker_routing_keys_active{worker="http://127.0.0.1:30002"} 0
smg_worker_requests_active{worker="http://127.0.0.1:30001"} 3
"""
    assert routing_keys_active(metrics) == {"http://127.0.0.1:30001": 1.0, "http://127.0.0.1:30002": 0.0}

    c = Cluster(ServeOptions(model_size="tiny"), 2, 30000)
    gauges: list[dict[str, float]] = []
    monkeypatch.setattr(c, "_keys_active", lambda: gauges.pop(0) if len(gauges) > 1 else gauges[0])
    w1, w2 = c.worker_urls
    far = 1e18
    gauges[:] = [{}, {w2: 1.0}]  # the router counts the key a moment later
    assert c._slot_worker(0, [], far) == w2
    gauges[:] = [{w2: 1.0, w1: 1.0}]
    assert c._slot_worker(1, [w2], far) == w1
    gauges[:] = [{w2: 2.0}]  # min_group put slot 1 beside slot 0 (another key was in flight)
    with pytest.raises(ClusterError, match="did not put routing slot 1 on a worker of its own"):
        c._slot_worker(1, [w2], far)
    gauges[:] = [{w1: 1.0, w2: 1.0}]  # someone else's key in flight too
    with pytest.raises(ClusterError, match="routing slot 0 on a worker of its own"):
        c._slot_worker(0, [], far)
    monkeypatch.setattr(router_module, "PIN_WAIT_S", 0.2)
    gauges[:] = [{w2: 0.0, w1: 1.0}]  # slot 0's held request ended: slot 1 took its place
    with pytest.raises(ClusterError, match="did not count routing slot 1 in flight"):
        c._slot_worker(1, [w2], far)


def test_the_sdk_counts_every_worker_the_router_lists_as_a_slot():
    listing = {
        "workers": [
            {"url": "http://a:1", "is_healthy": True},
            {"url": "http://b:1@0", "is_healthy": False},
            {"url": "http://b:1@1", "is_healthy": False},
        ]
    }
    assert parse_router_workers(listing) == RouterWorkers(["http://a:1"], 2), (
        "an unhealthy worker keeps its slot (the router re-places it)"
    )
    assert parse_router_workers({"detail": "Not Found"}) is None


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Two CPU workers (tiny model, pbkv) behind sglang-router on loopback."""
    pytest.importorskip("sglang_router")
    from agentcache.server_ext.launcher import ServeOptions, free_port
    from agentcache.server_ext.router import Cluster

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


def _worker_json(cluster, path: str, auth: dict) -> list[dict]:
    return [httpx.get(f"{url}{path}", headers=auth, timeout=30).json() for url in cluster.worker_urls]


def _run_workflows(cluster, key: str, tasks: list[str], agents: dict[str, dict], steps: int):
    """Run one SDK workflow per task against the cluster's router, each agent `steps` turns in a row; return
    (workflow ids, (workflow, agent name, routing key) of every request as it left the client)."""
    import openai

    import agentcache_sdk as ac

    sent: list[tuple[str, str, str]] = []

    def record(request: httpx.Request) -> None:
        if request.url.path.endswith("/chat/completions"):
            tags = json.loads(request.headers["x-request-id-agentcache"])
            sent.append((tags["workflow"], tags["agent_name"], request.headers["x-smg-routing-key"]))

    http = httpx.Client(event_hooks={"request": [record]}, timeout=120)
    client = openai.OpenAI(base_url=f"{cluster.base_url}/v1", api_key=key, max_retries=0, http_client=http)

    @ac.workflow
    def solve(task: str) -> str:
        for name, system in agents.items():
            messages = [system, {"role": "user", "content": task}]
            with ac.agent_name(name):
                for step in range(steps):
                    reply = client.chat.completions.create(
                        model="default", messages=messages, max_tokens=4, temperature=0
                    )
                    messages += [
                        {"role": "assistant", "content": reply.choices[0].message.content or "-"},
                        {"role": "user", "content": f"step {step} of {task}: go on"},
                    ]
        return ac.current_workflow().id

    try:
        workflows = [solve(task) for task in tasks]
    finally:
        http.close()
    assert ac.flush(30), "the end events were sent"
    return workflows, sent


@pytest.mark.server
def test_workflow_aware_routing_places_each_request_where_the_sdk_chose_and_ends_reach_every_worker(cluster):
    """The default against `agentcache serve --workers 2`: the SDK's WorkflowAwareRouting picks a slot per
    request, the router sends slot i to cluster.slot_workers[i], and each workflow's end reaches every worker
    that served it."""
    import agentcache_sdk as ac
    from agentcache.routing import slot_key

    assert sorted(cluster.slot_workers) == sorted(cluster.worker_urls), "one routing slot per worker"
    key = "sk-cluster-test"  # workflows are scoped per tenant (the bearer key): the SDK's end events need the same one
    auth = {"Authorization": f"Bearer {key}"}
    previous = (ac.settings.base_url, ac.settings.api_key, ac.settings.routing)
    ac.configure(base_url=cluster.base_url, api_key=key)
    assert ac.settings.routing == "workflow-aware", "the default"
    before = _worker_json(cluster, "/agentcache/v1/stats", auth)
    agents = {
        name: {"role": "system", "content": f"You are the {name} agent of a code assistant. " * 8}
        for name in ("planner", "coder", "tester")
    }
    try:
        workflows, sent = _run_workflows(
            cluster, key, ["add a flag", "fix the parser", "speed up the build"], agents, 2
        )
    finally:
        ac.settings.base_url, ac.settings.api_key, ac.settings.routing = previous
    assert len(sent) == 3 * 3 * 2
    slot_of = {slot_key(i): i for i in range(len(cluster.worker_urls))}
    assert {k for _, _, k in sent} <= slot_of.keys(), f"every request carried a slot key, no workflow id: {sent}"

    # What the SDK's routing decided is what went out, and every answer came back to it.
    routing = ac.routing_stats(cluster.base_url)
    assert routing["workers"] == 2
    chosen = Counter(slot_of[k] for _, _, k in sent)
    for slot in routing["slots"]:
        assert slot["requests"] == slot["answered"] == chosen[slot["slot"]] and slot["in_flight"] == 0, routing
    assert sum(s["prompt_tokens"] for s in routing["slots"]) > 0, "the answers' usage was fed back"

    # Each request was served by the worker of the slot it was sent to, per workflow and per agent.
    worker_of = dict(enumerate(cluster.slot_workers))
    served_by: dict[str, set[str]] = {}
    for wf in workflows:
        expected = Counter((worker_of[slot_of[k]], agent) for w, agent, k in sent if w == wf)
        for url, view in zip(cluster.worker_urls, _worker_json(cluster, f"/agentcache/v1/workflows/{wf}", auth)):
            mine = {agent: n for (u, agent), n in expected.items() if u == url}
            assert view["requests"] == sum(mine.values()) and view["agents"] == mine, f"{wf} on {url}: {view}"
            if mine:
                served_by.setdefault(wf, set()).add(url)
                # the end event reached this worker, which held the workflow
                assert view["ended"] is True and view["active"] is False, f"{wf} on {url}: {view}"
    assert any(len(urls) == 2 for urls in served_by.values()), f"the policy split a workflow over both: {served_by}"
    after = _worker_json(cluster, "/agentcache/v1/stats", auth)
    per_worker = Counter(worker_of[slot_of[k]] for _, _, k in sent)
    for url, b, a in zip(cluster.worker_urls, before, after):
        assert a["tagged_requests"] - b["tagged_requests"] == per_worker[url]
        # one end per workflow this worker served (an end for a workflow it never saw counts nowhere)
        assert a["ended_workflows"] - b["ended_workflows"] == sum(url in urls for urls in served_by.values())


@pytest.mark.server
def test_workflow_affinity_keeps_each_workflow_on_one_worker_and_the_sdk_ends_it_there(cluster):
    """Today's pinning, kept available: configure(routing="workflow-affinity") sends the workflow id as the key."""
    import agentcache_sdk as ac

    key = "sk-cluster-test"
    auth = {"Authorization": f"Bearer {key}"}
    previous = (ac.settings.base_url, ac.settings.api_key, ac.settings.routing)
    ac.configure(base_url=cluster.base_url, api_key=key, routing="workflow-affinity")
    before = _worker_json(cluster, "/agentcache/v1/stats", auth)
    agents = {"planner": {"role": "system", "content": "You are the planner agent of a code assistant. " * 8}}
    try:
        workflows, sent = _run_workflows(cluster, key, ["rename a module", "fix a typo"], agents, 3)
    finally:
        ac.settings.base_url, ac.settings.api_key, ac.settings.routing = previous
    assert all(k == wf for wf, _, k in sent) and len(sent) == 6, "the workflow id is the routing key"

    for wf in workflows:
        seen = _worker_json(cluster, f"/agentcache/v1/workflows/{wf}", auth)
        assert sorted(v["requests"] for v in seen) == [0, 3], f"{wf}: all 3 requests on one worker: {seen}"
        (home,) = [v for v in seen if v["requests"]]
        assert home["agents"] and home["cached_tokens"] > 0, "the tags in the forwarded header reached the worker"
        assert home["active"] is False, f"{wf} was retired on its worker after the workflow ended"
    after = _worker_json(cluster, "/agentcache/v1/stats", auth)
    assert sum(a["tagged_requests"] - b["tagged_requests"] for a, b in zip(after, before)) == 6
    # each end reached the worker that held its workflow
    assert sum(a["ended_workflows"] - b["ended_workflows"] for a, b in zip(after, before)) == 2


def test_a_request_whose_cached_prefix_leaves_too_few_slots_waits_for_them_and_is_not_refused():
    """SGLang pins a waiting request's cached prefix before it counts the evictable slots (schedule_policy's
    add_one_req): a prefix the request holds cannot also be evicted to make room for the rest of it. Such a
    request waits for the running ones to finish; only a request larger than the whole cache is refused."""
    from agentcache.replay.runner import PreparedTrace
    from agentcache.replay.serving import serve_trace
    from agentcache.trace import End, Meta, Request, Segment, Trace

    shared = (Segment("sys", 10), Segment("context", 490))
    events = [
        Request(0.0, "a", "writer", shared, 1, 1),  # leaves 500 tokens cached, evictable once it is done
        Request(1.0, "b", "other", (Segment("long", 440),), 1, 10),  # runs while c arrives: 449 slots held
        Request(1.0001, "c", "writer", (*shared, Segment("more", 140)), 1, 10),  # 500 cached, 149 more to hold
        End(2.0, "a"),
        End(2.0, "b"),
        End(2.0, "c"),
    ]
    result = serve_trace(PreparedTrace(Trace(Meta(name="pinned-prefix"), events)), "lru", 1000)
    a, b, c = sorted(result.served, key=lambda s: s.index)
    assert c.admitted, "c fits once b is done: it waits, as SGLang's scheduler keeps it in the queue"
    assert c.admitted_at >= b.finished
    assert c.hit_tokens == 500


def test_a_waiting_request_pins_only_the_tokens_it_matched_not_the_rest_of_their_node():
    """A match that ends inside a cached node splits it (SGLang's match_prefix), so the node's unmatched tail
    stays evictable and makes room for the request at once."""
    from agentcache.replay.runner import PreparedTrace
    from agentcache.replay.serving import serve_trace
    from agentcache.trace import End, Meta, Request, Segment, Trace

    events = [
        Request(0.0, "a", "writer", (Segment("brief", 100), Segment("draft", 500)), 0, 1),  # one 600-token node
        Request(1.0, "b", "other", (Segment("long", 290),), 0, 10),  # 299 slots held while c arrives: 101 free
        Request(1.0001, "c", "editor", (Segment("brief", 100), Segment("notes", 400)), 0, 1),  # 100 cached, 400 more
        End(2.0, "a"),
        End(2.0, "b"),
        End(2.0, "c"),
    ]
    result = serve_trace(PreparedTrace(Trace(Meta(name="partial-match"), events)), "lru", 1000)
    a, b, c = sorted(result.served, key=lambda s: s.index)
    assert c.admitted and c.hit_tokens == 100
    assert c.admitted_at < b.finished, "the draft's 500 tokens are evictable: c need not wait for b"


def test_a_prefill_batch_budgets_the_tokens_it_computes_not_those_it_reads_from_cache():
    """SGLang's prefill budget (rem_input_tokens) counts each request's uncached tokens: two requests that read
    a long cached prefix and compute little share one prefill batch."""
    from agentcache.replay.runner import PreparedTrace
    from agentcache.replay.serving import serve_trace
    from agentcache.trace import End, Meta, Request, Segment, Trace

    manual = Segment("manual", 9000)  # longer than the budget: cached, it costs the batch nothing
    events = [
        Request(0.0, "a", "reader", (manual,), 1, 1),  # caches the manual
        Request(10.0, "b", "reader", (manual, Segment("question-b", 100)), 1, 5),
        Request(10.0, "c", "reader", (manual, Segment("question-c", 100)), 1, 5),
        End(20.0, "a"),
        End(20.0, "b"),
        End(20.0, "c"),
    ]
    result = serve_trace(PreparedTrace(Trace(Meta(name="cached-manual"), events)), "lru", 20_000, prefill_budget=8192)
    a, b, c = sorted(result.served, key=lambda s: s.index)
    assert min(b.hit_tokens, c.hit_tokens) >= 8999
    assert b.admitted_at == c.admitted_at and b.first_token == c.first_token, "one prefill batch of 202 new tokens"


def _serve_on_one_worker(events, capacity: int, policy: str = "lru"):
    """The timed replay of `events` on one worker; the result and that worker (for its cache after the run)."""
    from agentcache.replay.runner import PreparedTrace
    from agentcache.replay.serving import serve_trace
    from agentcache.trace import Meta, Trace

    pool = []

    def router(_request, _enc, workers, _now):
        pool[:] = workers
        return 0

    result = serve_trace(PreparedTrace(Trace(Meta(name="one-worker"), events)), policy, capacity, router=router)
    return result, pool[0]


def test_output_slots_are_taken_a_decode_step_at_a_time_so_a_cached_prefix_outlives_the_admission():
    """SGLang allocates a request's prompt at its prefill and its output one token per decode step; a model that
    takes the whole output at admission evicts cached prefixes that SGLang still holds."""
    from agentcache.trace import End, Request, Segment

    brief = Segment("brief", 600)
    events = [
        Request(0.0, "a", "writer", (brief,), 0, 1),  # 600 cached: 600 of 1,200 slots free
        Request(1.0, "b", "other", (Segment("long", 200),), 0, 500),  # 200 now, 499 more over 499 decode steps
        Request(1.05, "c", "writer", (brief, Segment("question", 10)), 0, 1),  # b is decoding: the brief is there
        End(9.0, "a"),
        End(9.0, "b"),
        End(9.0, "c"),
    ]
    result, worker = _serve_on_one_worker(events, 1200)
    a, b, c = sorted(result.served, key=lambda s: s.index)
    assert c.admitted_at < b.finished, "c joined while b decoded"
    assert c.hit_tokens == 600, "b's admission did not evict the brief for output it had not written yet"
    assert worker.cache.room() == 1200, "every slot is free or evictable again: none leaked, none held"


def test_decode_that_runs_out_of_slots_retracts_the_request_that_wrote_least_and_serves_it_later():
    """Admissions count only a share of what running requests will still write (SGLang's new_token_ratio), so
    decode can run out of slots; SGLang then puts back in the queue the request that generated least, frees its
    output, and prefills it again later. Every request is served, and no slot leaks."""
    from agentcache.trace import End, Request, Segment

    events = [
        Request(0.0, "a", "one", (Segment("a", 300),), 0, 400),
        Request(0.0, "b", "two", (Segment("b", 300),), 0, 400),
        Request(0.05, "c", "three", (Segment("c", 300),), 0, 400),  # admitted against a share of a's and b's rest
        End(60.0, "a"),
        End(60.0, "b"),
        End(60.0, "c"),
    ]
    result, worker = _serve_on_one_worker(events, 2000)
    a, b, c = sorted(result.served, key=lambda s: s.index)
    assert all(s.admitted for s in (a, b, c))
    assert c.admitted_at < a.finished, "c was admitted while a and b decoded"
    assert (a.retracted, b.retracted, c.retracted) == (0, 0, 1)
    assert c.finished > max(a.finished, b.finished)
    assert result.summary()["retracted_requests"] == 1
    assert worker.cache.room() == 2000, "every slot is free or evictable again: none leaked, none held"


@pytest.mark.server
def test_sessions_in_other_clients_forms_follow_their_routing_as_our_workflows_do(cluster):
    """Behind the front, a session a client names in another stack's form (plain httpx, no SDK) is routed by its
    id, as a workflow is under routing="workflow-affinity": each session's requests on one worker, with the agent
    its form names there; its /close_session or final marker ends it there, a lease-only form leaves it active. Our
    tags, sent without a routing key, go the same way through the same front."""
    import time
    import uuid

    auth = {"Authorization": "Bearer sk-cluster-test"}

    def ours(s: str, final: bool) -> tuple[dict, dict]:
        tags = {"v": 1, "workflow": s, "agent": "a:1", "agent_name": "coder"}
        return {"x-request-id-agentcache": json.dumps(tags)}, {}

    def dynamo(s: str, final: bool) -> tuple[dict, dict]:
        return {"X-Dynamo-Session-ID": s, **({"X-Dynamo-Session-Final": "true"} if final else {})}, {}

    # form -> (headers and body fields of session s, its last request or not; the agent it names; ended by)
    forms = {
        "ours": (ours, "coder", None),
        "sglang-session": (lambda s, _: ({}, {"session_id": s, "agent_hints": {"agent_id": "planner"}}), "planner", "close"),
        "dynamo": (dynamo, None, "final"),
        "dynamo-nvext": (lambda s, f: ({}, {"nvext": {"agent_context": {"session_id": s, "session_final": f}}}), None, "final"),
        "claude-code": (lambda s, _: ({"x-claude-code-session-id": s, "x-claude-code-agent-id": "explore"}, {}), "explore", None),
        "opencode": (lambda s, _: ({"x-session-id": s}, {}), None, None),
    }  # fmt: skip
    steps, run = 3, uuid.uuid4().hex[:6]
    sessions = {form: [f"{form}-{run}-{i}" for i in range(3)] for form in forms}
    with httpx.Client(base_url=cluster.base_url, headers=auth, timeout=120) as client:
        for step in range(steps):
            for form, (shape, _, _) in forms.items():
                for session in sessions[form]:
                    headers, fields = shape(session, step == steps - 1)
                    messages = [
                        {"role": "system", "content": f"You are the {form} agent. " * 6},
                        {"role": "user", "content": f"{session}: step {step}"},
                    ]
                    body = {"model": "default", "messages": messages, "max_tokens": 2, "temperature": 0, **fields}
                    r = client.post("/v1/chat/completions", json=body, headers=headers)
                    assert r.status_code == 200, f"{form}: {r.text[:300]}"
        for session in sessions["sglang-session"]:
            assert client.post("/close_session", json={"session_id": session}).status_code == 200
    time.sleep(1.0)  # an end sent once its request was answered reaches the schedulers a moment later
    for form, (_, agent, ended_by) in forms.items():
        for session in sessions[form]:
            seen = _worker_json(cluster, f"/agentcache/v1/workflows/{session}", auth)
            assert sorted(v["requests"] for v in seen) == [0, steps], f"{form} {session}: one worker took all: {seen}"
            (home,) = [v for v in seen if v["requests"]]
            assert sum(home["agents"].values()) == steps, f"{form}: {home}"
            if agent is not None:
                assert list(home["agents"]) == [agent], f"{form}: the form's agent reached the worker: {home}"
            assert home["ended"] is (ended_by is not None), f"{form} {session}: {home}"
