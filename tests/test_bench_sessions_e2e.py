"""A live session-lfu run of the bench drives SGLang's own session cache as a user would: plain SGLang with
--enable-session-radix-cache, each workflow a session (top-level session_id), closed with /close_session at its end;
and that cache does what its help says: a path an open session holds outlives entries no session holds."""

from __future__ import annotations

import asyncio
import random
import re

import httpx
import pytest

from agentcache.bench.runner import BenchOptions, lifecycle_of, measure, vocab_size_of
from agentcache.bench.workload import TokenMaker, Workload
from agentcache.policy import PolicySpec
from agentcache.server_ext.launcher import ensure_model, free_port
from agentcache.workloads import GenConfig, generate

pytestmark = pytest.mark.server

CAPACITY = 1200  # KV tokens: four of the probe's prompts, so its flood evicts
PROBE_TOKENS = 300


def probe_prompt(name: str, vocab_size: int) -> list[int]:
    rng = random.Random(name)
    return [rng.randrange(10, vocab_size - 10) for _ in range(PROBE_TOKENS)]


def cached_after_pressure(client: httpx.Client, vocab_size: int) -> dict[str, int]:
    """Prompt tokens still cached for: A, held by an open session; U, sent after A by no session (lru and lfu alone
    would evict A first); B, whose session closed; after a flood of prompts that share nothing with them."""

    def send(name: str, session: str | None = None) -> int:
        body = {"input_ids": probe_prompt(name, vocab_size), "sampling_params": {"max_new_tokens": 1}}
        if session is not None:
            body["session_id"] = session
        answer = client.post("/generate", json=body)
        answer.raise_for_status()
        return int(answer.json()["meta_info"]["cached_tokens"])

    send("B", session="probe-B")
    client.post("/close_session", json={"session_id": "probe-B"}).raise_for_status()
    send("A", session="probe-A")
    send("U")
    for i in range(6):
        send(f"flood-{i}")
    return {"A": send("A", session="probe-A"), "U": send("U"), "B": send("B")}


def test_a_session_lfu_run_sends_session_ids_and_closes_each_workflows_session(tmp_path):
    spec = PolicySpec.parse("session-lfu")
    model = ensure_model(None, "tiny")
    vocab = vocab_size_of(model)
    trace = generate("code-retry", GenConfig(workflows=3, seed=1))
    workflows = {r.workflow for r in trace.requests}
    workload = Workload(trace, TokenMaker(vocab, 0.05), time_scale=0.01, max_new_tokens=2)
    opts = BenchOptions(
        policies=(spec,),
        repeat=1,
        model_path=model,
        model_size="tiny",
        cpu=True,
        port=free_port(),
        log_dir=str(tmp_path),
    )
    cached = {}

    def run_workload(base_url, headers, run_spec):
        answers = asyncio.run(workload.drive(base_url, headers, lifecycle=lifecycle_of(run_spec)))
        with httpx.Client(base_url=base_url, headers=headers, timeout=120) as client:
            cached.update(cached_after_pressure(client, vocab))
        return answers

    (run,) = measure(opts, run_workload, capacity=CAPACITY, vocab_size=vocab, warmup_tokens=50)
    assert len(run.sent) == workload.requests and run.hit_rate > 0

    log = (tmp_path / "session-lfu-1.log").read_text()
    assert "'enable_session_radix_cache': True" in log
    assert "'radix_eviction_policy': 'lfu'" in log
    # Each workflow's End closed its session, which held the path its requests left (a request without the
    # top-level session_id leaves its session nothing to hold: "indexed 0 component leaves").
    released = dict(re.findall(r"release_session (\S+): indexed (\d+) component leaves", log))
    assert workflows <= released.keys()
    assert all(int(released[w]) > 0 for w in workflows)

    assert cached["A"] == PROBE_TOKENS - 1  # held by its open session: outlived the flood
    assert cached["U"] == 0  # newer than A, but no session held it
    assert cached["B"] == 0  # its session closed: evicted like any other entry
