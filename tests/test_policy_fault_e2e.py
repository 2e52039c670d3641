"""A policy that raises inside the live server (SGLang's real scheduler on CPU, a fault injected into pbkv)."""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest

from agentcache.bench.runner import BenchOptions, measure, vocab_size_of
from agentcache.bench.workload import BenchError
from agentcache.compiled import PURE_ENV
from agentcache.policy.spec import PolicySpec
from agentcache.server_ext.launcher import ensure_model, free_port

FAULT_INJECTION = Path(__file__).parent / "fault_injection"


def request(i: int) -> dict:
    """Prompts of 350 tokens that share a 50-token fixed prompt per agent: a 1,200-token cache evicts for most."""
    agent = i % 3
    tags = {"v": 1, "workflow": f"w{i % 5}", "agent": f"a{agent}", "fixed_tokens": 50}
    return {
        "input_ids": [5 + agent] * 50 + list(range(100 + 3 * i, 400 + 3 * i)),
        "sampling_params": {"max_new_tokens": 4, "custom_params": {"agentcache": tags}},
    }


def test_a_policy_that_raises_in_the_live_server_is_dropped_for_lru_and_a_bench_run_says_so(tmp_path, monkeypatch):
    """Before, the exception went up through SGLang's scheduler, which exited and failed every request on the
    worker (a fault in the checkpoint into the tree too, injected first). Now every request is answered, the
    server logs and counts the faults and evicts by SGLang's LRU after the one in eviction, and `agentcache bench`
    (and demo) refuse the run: its figures would be lru's under pbkv's name."""
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(filter(None, [str(FAULT_INJECTION), os.environ.get("PYTHONPATH")]))
    )
    monkeypatch.setenv("AGENTCACHE_TEST_FAULT_AFTER", "30")
    monkeypatch.setenv("AGENTCACHE_TEST_SPLIT_FAULT_AFTER", "5")  # in the checkpoint into the tree, before that
    # The fault is injected by replacing a method of pbkv's class, which its compiled build does not allow.
    monkeypatch.setenv(PURE_ENV, "1")
    answers: list[int] = []

    def run_workload(base_url: str, headers: dict[str, str], spec: PolicySpec) -> tuple[list, float]:
        with httpx.Client(base_url=base_url, headers=headers, timeout=120) as client:
            answers.extend(client.post("/generate", json=request(i)).status_code for i in range(40))
        return [], 1.0

    opts = BenchOptions(
        policies=(PolicySpec.parse("pbkv"),), repeat=1, model_size="tiny", port=free_port(), log_dir=str(tmp_path)
    )
    with pytest.raises(
        BenchError, match="the policy raised during the run .*'pbkv \\(dropped after a fault: evicting by lru\\)'"
    ):
        measure(
            opts, run_workload, capacity=1200, vocab_size=vocab_size_of(ensure_model(None, "tiny")), warmup_tokens=64
        )
    assert answers == [200] * 40, "every request answered, after the fault too"
    log = (tmp_path / "pbkv-1.log").read_text()
    assert "agentcache: the pbkv policy failed in" in log and "a fault injected into pbkv's key computation" in log
    # The checkpoint's fault (issue 55, case 10) took the scheduler down before; now it is one bookkeeping fault.
    assert "failed in a checkpoint into the tree" in log and "a fault injected into a path's walk" in log
