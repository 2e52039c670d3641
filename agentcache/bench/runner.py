"""A bench's runs, measured fairly: every (repetition, policy) on a fresh, warmed-up server, in alternating order."""

from __future__ import annotations

import asyncio
import functools
import json
import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from agentcache.bench.forms import FORMS, OURS, VIA, ClientForm, run_label
from agentcache.bench.runs import Run, run_order
from agentcache.bench.workload import BenchError, Lifecycle, Sent, TokenMaker, Workload, as_served
from agentcache.policy import PolicySpec
from agentcache.policy.spec import SGLANG_STRATEGIES
from agentcache.trace import Trace

# SGLang's default (lru), one flag away (lfu), its session cache over lfu (the issue 51 baseline), and ours.
DEFAULT_POLICIES = "lru,lfu,session-lfu,pbkv"
# On CPU the engine runs one torch thread: with one per core, a run's timing hinged on whether any other
# process held a core (a spinning thread waiting for a descheduled one made single runs up to 15x slower).
ENGINE_CPU_THREADS = 1
FLUSH_WAIT_S = 30.0  # for the server to let the warm-up's last request go before it empties its cache
CAPACITY_FACTOR = 10  # default KV capacity: this many mean prompts (with requests in flight holding theirs, tight)


@dataclass
class BenchOptions:
    policies: tuple[PolicySpec, ...] = ()
    repeat: int = 3
    capacity: int | None = None  # KV tokens; None: CAPACITY_FACTOR mean prompts of the workload
    model_path: str | None = None
    model_size: str = "small"
    cpu: bool | None = None
    port: int = 30300
    log_dir: str | None = None
    warmup_requests: int = 3
    extra_args: list[str] = field(default_factory=list)
    # the forms the plugin's runs name workflows in (each a run of its own per repetition); plain SGLang's use ours
    forms: tuple[ClientForm, ...] = (FORMS[OURS],)


def runs_on_plain_sglang(spec: PolicySpec) -> bool:
    """SGLang's own strategies (lru included), and its session cache over them (session-lru, session-lfu), run on
    a server without the plugin, as a user would run them."""
    return spec.strategy in SGLANG_STRATEGIES and (spec.builtin or spec.name == "lru")


def lifecycle_of(spec: PolicySpec) -> Lifecycle:
    """How a run of `spec` tells its server about workflows: the plugin's end route, SGLang's sessions (each
    workflow a session, its end a /close_session), or not at all (plain SGLang has no notion of them)."""
    if spec.sessions:
        return Lifecycle.SESSIONS
    return Lifecycle.NONE if runs_on_plain_sglang(spec) else Lifecycle.PLUGIN


def server_kind(spec: PolicySpec) -> str:
    """The server a run of `spec` starts, in words (for progress lines)."""
    if spec.sessions:
        return "SGLang with its session cache"
    return "SGLang" if runs_on_plain_sglang(spec) else "SGLang with agentcache"


def live_refusal(spec: PolicySpec) -> str | None:
    """Why `spec` cannot run on a live server (bench, demo), or None where it can."""
    if not spec.online or spec.prefetch:
        return f"{spec.text} cannot run live (offline references and prefetch variants are replay-only)"
    return None


def best_sglang_strategy(runs: Sequence[Run], besides: Sequence[str] = ("lru",)) -> str | None:
    """The best by median hit rate of the SGLang strategies that ran on plain SGLang (its session caches
    included), `besides` aside; the first listed on a tie; None where none ran."""
    policies = dict.fromkeys(r.policy for r in runs if VIA not in r.policy)
    others = [p for p in policies if p not in besides and runs_on_plain_sglang(PolicySpec.parse(p))]
    if not others:
        return None
    return max(others, key=lambda p: statistics.median(r.hit_rate for r in runs if r.policy == p))


def serve_options(spec: PolicySpec, opts: BenchOptions, capacity: int, run_name: str) -> Any:
    from agentcache.server_ext.launcher import ServeOptions

    plain = runs_on_plain_sglang(spec)
    # SGLang's own strategy, and its session cache over it (which falls back to SGLang's Python tree core by
    # itself: the Rust one refuses sessions), as a user of plain SGLang turns them on.
    flags = ["--radix-eviction-policy", spec.strategy] if plain else []
    if spec.sessions:
        flags.append("--enable-session-radix-cache")
    return ServeOptions(
        model_path=opts.model_path,
        model_size=opts.model_size,
        policy=spec.text,
        plugin=not plain,
        cpu=opts.cpu,
        port=opts.port,
        max_total_tokens=capacity,
        extra_args=[*flags, *opts.extra_args],
        log_path=f"{opts.log_dir}/{run_name}.log" if opts.log_dir else None,
        cpu_threads=ENGINE_CPU_THREADS,
    )


def warm_up(base_url: str, headers: dict[str, str], vocab_size: int, prompt_tokens: int, n: int) -> None:
    """Requests that share nothing with the workload, so the first measured request does not pay for the
    engine's first calls; then the cache is emptied, as every run starts with an empty cache."""
    rng = random.Random("warm-up")
    with httpx.Client(base_url=base_url, headers=headers, timeout=600) as client:
        for _ in range(n):
            ids = [rng.randrange(10, max(11, vocab_size - 10)) for _ in range(max(1, prompt_tokens))]
            answer = client.post("/generate", json={"input_ids": ids, "sampling_params": {"max_new_tokens": 2}})
            if answer.is_error:  # the server says why (a prompt beyond the KV capacity, say): pass it on
                raise BenchError(
                    f"the server refused a warm-up request of {len(ids):,} tokens (HTTP {answer.status_code}):"
                    f" {answer.text.strip()[:500]}"
                )
        flush_cache(client)


def flush_cache(client: httpx.Client, wait_s: float = FLUSH_WAIT_S) -> None:
    """Empty the server's cache. SGLang refuses (400) while a request is still running, and its last answer
    can come back a moment before the scheduler lets the request go: ask again until it flushes."""
    deadline = time.monotonic() + wait_s
    while True:
        answer = client.post("/flush_cache")
        if answer.status_code != 400 or time.monotonic() > deadline:
            answer.raise_for_status()
            return
        time.sleep(0.1)


# (base_url, headers, spec) -> every answer and the completion time; a runner that takes `form=` (a ClientForm)
# can also be measured in forms other than ours (BenchOptions.forms)
WorkloadRunner = Callable[..., tuple[list[Sent], float]]


@dataclass(frozen=True)
class Stage:
    """Where a bench is, for a progress display: which run of how many, and what that run is doing."""

    policy: str
    repetition: int  # from 0
    repeat: int
    run: int  # from 0, in the order the runs go; -1 while servers kept for every run start (the demo's)
    runs: int
    step: str  # "starting SGLang", "warming up", "running", "done"

    @property
    def where(self) -> str:
        return f"{self.policy} (repetition {self.repetition + 1} of {self.repeat})"


def measure(
    opts: BenchOptions,
    run_workload: WorkloadRunner,
    *,
    capacity: int,
    vocab_size: int,
    warmup_tokens: int,
    stage: Callable[[Stage], None] = lambda _: None,
) -> list[Run]:
    """Every (repetition, policy) on a fresh, warmed-up server, in alternating order.

    `run_workload(base_url, headers, spec)` sends the workload and returns every answer and the
    completion time (`run_workload(..., form=FORM)` for each of `opts.forms` other than ours, on the plugin's
    runs: a run each, named `POLICY via FORM`); `stage` hears what is happening, for a progress display.
    """
    from agentcache.server_ext.launcher import Server, ServerError

    variants = {}
    for s in opts.policies:
        for form in opts.forms if lifecycle_of(s) is Lifecycle.PLUGIN else (FORMS[OURS],):
            variants[run_label(s.text, form)] = (s, form)
    order = run_order(list(variants), opts.repeat)
    runs = []
    for index, (repetition, policy) in enumerate(order):
        spec, form = variants[policy]
        runner = run_workload if form.name == OURS else functools.partial(run_workload, form=form)
        name = f"{policy.replace('/', '_').replace(VIA, '.')}-{repetition + 1}"
        at = functools.partial(Stage, policy, repetition, opts.repeat, index, len(order))  # at(step): a Stage
        where = at("").where
        stage(at(f"starting {server_kind(spec)}"))
        options = serve_options(spec, opts, capacity, name)
        try:
            with Server(options) as server:
                headers = server.auth_headers()
                stage(at("warming up"))
                warm_up(server.base_url, headers, vocab_size, warmup_tokens, opts.warmup_requests)
                stage(at("running"))
                sent, makespan = run_measured(runner, spec, server.base_url, headers, options.log_path)
        except (ServerError, httpx.HTTPError, BenchError) as exc:
            raise BenchError(f"{where}: {exc}") from exc
        runs.append(Run(policy, repetition, sent, makespan))
        stage(at("done"))
    return runs


def run_measured(
    run_workload: WorkloadRunner, spec: PolicySpec, base_url: str, headers: dict[str, str], log_path: str | None
) -> tuple[list[Sent], float]:
    """One run of the workload; on the plugin, refused where the policy raised: that run is no measure of it."""
    sent, makespan = run_workload(base_url, headers, spec)
    if not runs_on_plain_sglang(spec):
        stats = server_stats(base_url, headers)
        if stats.get("policy_faults"):
            log = f" (log: {log_path})" if log_path else ""
            raise BenchError(
                f"the policy raised during the run (in {', '.join(stats['policy_faults'])}); the server ran it as"
                f" {stats['policy']!r}{log}"
            )
    return sent, makespan


def server_stats(base_url: str, headers: dict[str, str]) -> dict[str, Any]:
    r = httpx.get(f"{base_url}/agentcache/v1/stats", headers=headers, timeout=60)
    r.raise_for_status()
    return r.json()


def model_config(model_path: str) -> dict[str, Any]:
    return json.loads((Path(model_path) / "config.json").read_text())


def vocab_size_of(model_path: str) -> int:
    return int(model_config(model_path)["vocab_size"])


def check_servable(served: Trace, limit: int, token_scale: float) -> None:
    """Refuse, before any server starts, a request that no server of this bench can hold (prompt and output
    within the KV capacity and the model's context): it would only be refused, or its tokens not fit in memory."""
    for index, request in enumerate(served.requests):
        tokens = request.prompt_tokens + request.output
        if tokens > limit:
            raise BenchError(
                f"request {index} (workflow {request.workflow!r}) needs {tokens:,} tokens at --token-scale"
                f" {token_scale:g} (prompt and output), more than the {limit:,} a server here holds (the KV capacity"
                " and the model's context)"
            )


def bench_trace(
    trace: Trace,
    opts: BenchOptions,
    *,
    token_scale: float,
    time_scale: float,
    max_new_tokens: int,
    stage: Callable[[Stage], None] = lambda _: None,
    answered: Callable[[], None] | None = None,
) -> tuple[list[Run], int]:
    """The trace driven once per (policy, repetition); the runs, and the KV capacity they had.

    `stage` hears what is happening and `answered` each answer, for a progress display.
    """
    from agentcache.server_ext.launcher import ensure_model

    model = ensure_model(opts.model_path, opts.model_size)
    opts.model_path = model
    config = model_config(model)
    served = as_served(trace, token_scale, max_new_tokens)
    mean_prompt = sum(r.prompt_tokens for r in served.requests) / len(served.requests)
    capacity = opts.capacity or int(CAPACITY_FACTOR * mean_prompt)
    check_servable(served, min(capacity, int(config["max_position_embeddings"])), token_scale)
    vocab = int(config["vocab_size"])
    workload = Workload(trace, TokenMaker(vocab, token_scale), time_scale, max_new_tokens)

    def run_workload(
        base_url: str, headers: dict[str, str], spec: PolicySpec, form: ClientForm = FORMS[OURS]
    ) -> tuple[list[Sent], float]:
        return asyncio.run(
            workload.drive(base_url, headers, lifecycle=lifecycle_of(spec), on_answer=answered, form=form)
        )

    runs = measure(opts, run_workload, capacity=capacity, vocab_size=vocab, warmup_tokens=int(mean_prompt), stage=stage)
    return runs, capacity
