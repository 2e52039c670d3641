"""The main job, `agentcache demo`, run as the README runs it (small: one repetition, two workflows, three servers
side by side: SGLang's default, its session cache, and agentcache)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from agentcache.server_ext.launcher import free_port
from agentcache.trace import Next, ToolEnd, ToolStart, read_trace

pytestmark = pytest.mark.server


def test_the_demo_runs_workflows_through_the_server_and_reports_each_policy(tmp_path):
    logs = tmp_path / "logs"
    cmd = [
        sys.executable,
        "-m",
        "agentcache.cli",
        "demo",
        "--policies",
        "lru,session-lfu,pbkv",
        "--repeat",
        "1",
        "--workflows",
        "2",
        "--port",
        str(free_port()),
        "--log-dir",
        str(logs),
        "--record",
        str(tmp_path / "demo.jsonl"),
        "--json",
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert list(summary) == ["lru", "session-lfu", "pbkv"]
    for r in summary.values():
        assert {"hit_rate", "mean_latency_s", "p90_latency_s", "requests"} <= set(r)
        assert r["requests"] >= 2 * 3, "every workflow makes several LLM calls"
        assert 0.0 < r["hit_rate"] < 1.0, "later calls reuse the agents' fixed prompts"
        assert r["mean_latency_s"] > 0
    assert len({r["requests"] for r in summary.values()}) == 1, "every policy served the same workflows"
    assert "ready to roll" in (logs / "pbkv.log").read_text(), "the server's log went to --log-dir, not stdout"
    lru_log, session_log = (logs / "lru.log").read_text(), (logs / "session-lfu.log").read_text()
    assert "'radix_cache_backend': None" in lru_log, "lru is plain SGLang, as users run it"
    assert "'enable_session_radix_cache': True" in session_log and "'radix_cache_backend': None" in session_log
    assert session_log.count('"POST /close_session HTTP/1.1" 200') == 2, "each workflow's session closed at its end"
    assert "close_session" not in lru_log
    assert "--sleep-on-idle" not in done.stdout and "'sleep_on_idle': True" in lru_log, "idle servers sleep"
    assert "Prefill batch" not in done.stdout
    assert "pbkv against lru: " in done.stdout and "x faster on mean latency" in done.stdout
    assert done.stdout.count("In short: pbkv's hit rate was ") == 1
    errors = [line for line in done.stderr.splitlines() if "error" in line.lower() or "could not" in line.lower()]
    assert not errors, errors
    # Progress, into a pipe: plain lines on stderr at every step and at least every 15 s; stdout holds the
    # table, the ratio lines and the --json line alone
    assert "requests done" not in done.stdout and "\x1b" not in done.stdout + done.stderr
    progress = [line for line in done.stderr.splitlines() if line.startswith("[")]
    assert progress[0] == "[0s] getting the model ready", progress[:3]
    assert any(" starting 3 SGLang servers side by side (lru, session-lfu, pbkv): 0 ready" in line for line in progress)
    assert any(" lru (repetition 1 of 1), run 1 of 3: emptying its cache; 0 requests done" in line for line in progress)
    assert any(" pbkv (repetition 1 of 1), run 3 of 3: running; " in line for line in progress)
    n = summary["lru"]["requests"]
    assert progress[-1].endswith(f"3 of 3: done; {n:.0f} of {n:.0f} requests done ({3 * n:.0f} in all); about 0s left")
    stamps = [_seconds(line[1 : line.index("]")]) for line in progress]
    assert max(b - a for a, b in zip(stamps, stamps[1:])) <= 15, progress
    # --record: the run with agentcache, streamed as the demo's apps stream, as a replayable trace
    trace = read_trace(tmp_path / "demo.jsonl")
    assert len(trace.requests) == summary["pbkv"]["requests"] and len(trace.ended_workflows) == 2
    assert {r.agent for r in trace.requests} <= {"planner", "coder", "reviewer", "decomposer", "retriever", "verifier"}
    # each tool call the apps made was told to the server (the SDK's tool events, recorded beside the requests),
    # and the agent that called the tool is the one whose call comes next
    starts = [e for e in trace.events if isinstance(e, ToolStart)]
    ends = [e for e in trace.events if isinstance(e, ToolEnd)]
    assert starts and len(starts) == len(ends), (len(starts), len(ends))
    assert {(e.agent, e.tool) for e in starts} <= {("coder", "run_tests"), ("retriever", "search_web")}
    # the apps' plans and routing decisions, told as a framework's would be: each decision names an agent the
    # app's graph lets call next, and that agent makes the workflow's next call
    assert trace.meta.plan is not None and trace.meta.plan.graph
    nexts = [e for e in trace.events if isinstance(e, Next)]
    assert nexts and {a for e in nexts for a in e.agents} <= {"reviewer", "verifier", "retriever"}
    for decision in nexts:
        after = [r for r in trace.requests if r.workflow == decision.workflow and r.ts >= decision.ts]
        assert after and after[0].agent in decision.agents


def test_the_demo_records_only_where_requests_are_tagged(tmp_path, capsys):
    from agentcache.cli import main

    assert main(["demo", "--policies", "lru,lfu", "--record", str(tmp_path / "t.jsonl")]) == 2
    assert "--record: lru,lfu runs on plain SGLang only, whose requests are not tagged" in capsys.readouterr().err
    assert not (tmp_path / "t.jsonl").exists()


def _seconds(stamp: str) -> int:
    """`[1m05s]` or `[45s]`, a progress line's time since the start, in seconds."""
    minutes, _, seconds = stamp.rstrip("s").rpartition("m")
    return int(minutes or 0) * 60 + int(seconds)


def test_the_demo_refuses_what_cannot_run_live_before_any_server_starts(capsys):
    from agentcache.cli import main

    assert main(["demo", "--policies", "lru,belady"]) == 2
    assert "--policies: belady cannot run live" in capsys.readouterr().err
