"""The demo without a server: how its apps tell a server about workflows, how its runs share servers, what it says."""

from __future__ import annotations

import asyncio
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import pytest

from agentcache.bench.runner import BenchOptions, Stage
from agentcache.bench.runs import Run
from agentcache.bench.workload import Lifecycle, Sent
from agentcache.demo import run as demo_run
from agentcache.demo.apps import DemoApps, run_workflows
from agentcache.demo.summary import ratio_lines, verdict
from agentcache.policy import PolicySpec


class Completions:
    """The openai SDK's chat.completions, answering every streamed call with one chunk and its usage."""

    def __init__(self) -> None:
        self.calls: list[dict] = []

    async def create(self, **kwargs):
        self.calls.append(kwargs)
        usage = SimpleNamespace(prompt_tokens=10, prompt_tokens_details=SimpleNamespace(cached_tokens=4))
        chunk = SimpleNamespace(choices=[SimpleNamespace(delta=SimpleNamespace(content="ok"))], usage=usage)

        async def stream():
            yield chunk

        return stream()


@pytest.fixture
def closes():
    """A server that records each /close_session body."""
    seen: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):  # noqa: ANN002
            pass

        def do_POST(self):  # noqa: N802
            seen.append({"path": self.path, **json.loads(self.rfile.read(int(self.headers["content-length"])))})
            self.send_response(200)
            self.send_header("content-length", "0")
            self.end_headers()

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", seen
    server.shutdown()


def apps_of(completions: Completions) -> DemoApps:
    client = SimpleNamespace(chat=SimpleNamespace(completions=completions))
    return DemoApps(client, model="default", tool_pauses_s={})


def test_a_session_run_sends_each_workflows_session_with_every_call_and_closes_it_at_its_end(closes):
    base_url, seen = closes
    completions = Completions()
    apps = apps_of(completions)
    asyncio.run(run_workflows(apps, 4, 2, seed=0, lifecycle=Lifecycle.SESSIONS, base_url=base_url))
    sessions = [call["extra_body"]["session_id"] for call in completions.calls]
    assert len(set(sessions)) == 4, "each workflow is a session of its own"
    assert len(apps.records) == len(sessions) > 4 * 2, "every call carries its workflow's session"
    assert sorted(c["session_id"] for c in seen) == sorted(set(sessions)), "each session closed once"
    assert {c["path"] for c in seen} == {"/close_session"}


@pytest.mark.parametrize("lifecycle", [Lifecycle.NONE, Lifecycle.PLUGIN])
def test_other_runs_send_no_session_and_close_none(closes, lifecycle):
    base_url, seen = closes
    completions = Completions()
    asyncio.run(run_workflows(apps_of(completions), 2, 2, seed=0, lifecycle=lifecycle, base_url=base_url))
    assert completions.calls and all(call["extra_body"] is None for call in completions.calls)
    assert seen == []


class FakeServer:
    """launcher.Server's surface as the demo uses it."""

    started: list[str] = []
    stopped: list[str] = []

    def __init__(self, opts):
        self.opts = opts
        self.base_url = opts.policy

    def start(self):
        FakeServer.started.append(self.opts.policy)
        return self

    def stop(self):
        FakeServer.stopped.append(self.opts.policy)

    def auth_headers(self):
        return {}


def test_each_policy_gets_one_server_for_every_run_and_an_empty_cache_before_each(monkeypatch):
    import agentcache.bench.runner as bench_runner
    import agentcache.server_ext.launcher as launcher

    FakeServer.started, FakeServer.stopped = [], []
    monkeypatch.setattr(launcher, "Server", FakeServer)
    monkeypatch.setattr(launcher, "port_is_free", lambda host, port: True)
    events: list[str] = []
    monkeypatch.setattr(demo_run, "warm_up", lambda url, *args: events.append(f"warm {url}"))
    monkeypatch.setattr(demo_run, "flush", lambda url, headers: events.append(f"flush {url}"))
    monkeypatch.setattr(bench_runner, "server_stats", lambda url, headers: {})  # what run_measured asks

    def workload(url, headers, spec):
        events.append(f"run {url}")
        return [Sent(0.1, 0.2, 10, 5)], 1.0

    stages: list[Stage] = []
    policies = tuple(PolicySpec.parse(p) for p in ("lru", "session-lfu", "pbkv"))
    opts = BenchOptions(policies=policies, repeat=2, port=31000)
    runs = demo_run.measure_on_kept_servers(
        opts, workload, capacity=100, vocab_size=50, warmup_tokens=5, stage=stages.append
    )
    assert sorted(FakeServer.started) == sorted(FakeServer.stopped) == ["lru", "pbkv", "session-lfu"]
    assert [(r.policy, r.repetition) for r in runs] == [
        ("lru", 0), ("session-lfu", 0), ("pbkv", 0), ("pbkv", 1), ("session-lfu", 1), ("lru", 1)
    ], "alternating order"  # fmt: skip
    assert events[:3] == ["warm lru", "warm session-lfu", "warm pbkv"], "each server warmed up once"
    assert events[3:] == [f"{what} {r.policy}" for r in runs for what in ("flush", "run")], "a flush before each run"
    assert stages[0].run == -1 and "starting 3 SGLang servers side by side" in stages[0].step
    assert [s.run for s in stages if s.step == "done"] == list(range(6))


def test_a_kept_servers_args_sleep_when_idle_and_take_consecutive_ports(monkeypatch):
    import agentcache.server_ext.launcher as launcher

    made = []
    monkeypatch.setattr(launcher, "Server", lambda opts: made.append(opts) or FakeServer(opts))
    monkeypatch.setattr(launcher, "port_is_free", lambda host, port: True)
    policies = tuple(PolicySpec.parse(p) for p in ("lfu", "pbkv"))
    demo_run.start_side_by_side(BenchOptions(policies=policies, port=31000), 100, lambda _: None, 4)
    assert [o.port for o in made] == [31000, 31001]
    assert [o.extra_args for o in made] == [["--radix-eviction-policy", "lfu", "--sleep-on-idle"], ["--sleep-on-idle"]]
    assert [o.plugin for o in made] == [False, True]


def runs_of(hits: dict[str, list[int]], latency: dict[str, float]) -> list[Run]:
    return [
        Run(p, r, [Sent(0.1, latency[p], 100, cached)] * 4, 10.0)
        for r in range(3)
        for p, per_rep in hits.items()
        for cached in [per_rep[r]]
    ]


def test_the_demo_ends_with_one_plain_line_saying_where_ours_is_ahead_and_where_not():
    hits = {"lru": [50, 50, 50], "lfu": [60, 57, 59], "session-lfu": [55, 56, 57], "pbkv": [58, 58, 58]}
    runs = runs_of(hits, {"lru": 0.6, "lfu": 0.5, "session-lfu": 0.55, "pbkv": 0.52})
    assert [line.split(":")[0] for line in ratio_lines(runs)] == [
        "pbkv against lru", "pbkv against lfu", "pbkv against session-lfu"
    ]  # fmt: skip
    assert ratio_lines(runs)[1].startswith("pbkv against lfu: 0.98x the hit rate [0.97-1.02], higher in 1 of 3")
    (line,) = verdict(runs)
    assert line == (
        "In short: pbkv's hit rate was above lru's (by +8.0 points [+8.0 to +8.0]) and session-lfu's (by +2.0 points"
        " [+1.0 to +3.0]) in every repetition; it was not above lfu's (higher in 1 of 3, by -1.0 points [-2.0 to"
        " +1.0]) in every one; its mean latency (median) was lower than lru's and session-lfu's, not lower than lfu's."
    )


def test_the_line_where_ours_is_ahead_of_every_other_policy():
    hits = {"lru": [50, 51, 52], "pbkv": [58, 59, 60]}
    (line,) = verdict(runs_of(hits, {"lru": 0.6, "pbkv": 0.5}))
    assert line == (
        "In short: pbkv's hit rate was above lru's (by +8.0 points [+8.0 to +8.0]) in every repetition;"
        " its mean latency (median) was lower than lru's."
    )


def test_the_demo_compares_ours_with_lru_lfu_and_sglangs_session_cache_by_default():
    assert demo_run.DemoOptions().policies == ("lru", "lfu", "session-lfu", "pbkv")


def test_the_servers_ports_are_checked_before_any_starts(capsys):
    from agentcache.cli import main

    assert main(["demo", "--port", "65534"]) == 2
    assert "--port: the demo's 4 servers take --port and the ports after it; at most 65532" in capsys.readouterr().err
