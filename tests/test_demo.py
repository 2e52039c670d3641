"""The main job, `agentcache demo`, run as the README runs it (small: one policy, two workflows)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import free_port

pytestmark = pytest.mark.server


def test_the_demo_runs_workflows_through_the_server_and_reports_each_policy(tmp_path):
    logs = tmp_path / "logs"
    cmd = [
        sys.executable,
        "-m",
        "agentcache.cli",
        "demo",
        "--policies",
        "pbkv",
        "--workflows",
        "2",
        "--port",
        str(free_port()),
        "--log-dir",
        str(logs),
        "--json",
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert list(summary) == ["pbkv"]
    pbkv = summary["pbkv"]
    assert pbkv["requests"] >= 2 * 3, "every workflow makes several LLM calls"
    assert 0.0 < pbkv["hit_rate"] < 1.0, "later calls reuse the agents' fixed prompts"
    assert pbkv["mean_latency_s"] > 0
    assert "ready to roll" in (logs / "server-pbkv.log").read_text(), "the server's log went to --log-dir, not stdout"
    assert "Prefill batch" not in done.stdout
