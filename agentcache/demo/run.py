"""The demo's runs: every policy's server started once, side by side, and every (repetition, policy) run on it
with its cache flushed, in alternating order (or, with `fresh_servers`, a fresh server per run, as the live
bench does: the check that a flushed server gives a fresh one's figures)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import httpx

from agentcache.bench.runner import (
    BenchOptions,
    Stage,
    WorkloadRunner,
    lifecycle_of,
    measure,
    run_measured,
    serve_options,
    warm_up,
)
from agentcache.bench.runs import Run, run_order
from agentcache.bench.workload import BenchError, Lifecycle, Sent
from agentcache.demo.apps import DemoApps, run_workflows
from agentcache.policy import PolicySpec

if TYPE_CHECKING:
    from agentcache.server_ext.launcher import Server

DEFAULT_POLICIES = ("lru", "lfu", "session-lfu", "pbkv")
END_EVENTS_TIMEOUT_S = 30.0
WARMUP_TOKENS = 600
FLUSH_TIMEOUT_S = 30.0  # SGLang flushes only an idle cache: how long it may wait for the last requests to go
# An idle server sleeps on its sockets instead of polling them: the servers not measured leave both cores to
# the one that is.
KEPT_SERVER_ARGS = ["--sleep-on-idle"]


@dataclass
class DemoOptions:
    policies: tuple[str, ...] = DEFAULT_POLICIES
    repeat: int = 3
    # A deployment's shape, small enough for 2 CPU cores: more workflows in flight than the cache holds
    # histories for, each history growing with every tool's output past its agent's fixed prompt.
    workflows: int = 12
    concurrency: int = 6
    # KV tokens: the fixed prompts (a head all share, the chat template and the tools, about 370 tokens, then about
    # 230 for each of the six agents: about 1,750 in all) and the histories of about two of the six workflows in
    # flight (each grows from about 150 to 1,200 tokens); requests of 750 to 1,800 tokens.
    capacity: int = 3500
    system_words: int = 60  # each agent's fixed prompt
    task_words: int = 40  # the task or claim a workflow starts from
    tool_words: int = 60  # each tool's output, appended to the workflow's history
    seed: int = 0
    port: int = 30000  # the first server's; the others take the next ones
    fresh_servers: bool = False  # a fresh server per run instead of one per policy, flushed before each run
    model_path: str | None = None
    model_size: str = "small"
    log_dir: str | None = None
    record: str | None = None  # a trace file: the first run with agentcache records its traffic there


def run_demo(
    opts: DemoOptions, stage: Callable[[Stage], None] = lambda _: None, answered: Callable[[], None] | None = None
) -> list[Run]:
    """Every policy and repetition on an empty, warmed-up cache, the same workflows each time."""
    import openai

    import agentcache_sdk as ac
    from agentcache.bench.runner import vocab_size_of
    from agentcache.server_ext.launcher import ensure_model

    model = ensure_model(opts.model_path, opts.model_size)
    unrecorded = [opts.record] if opts.record else []  # every run serves the same workflows: record one

    def run_apps(base_url: str, headers: dict[str, str], spec: PolicySpec) -> tuple[list[Sent], float]:
        lifecycle = lifecycle_of(spec)  # plain SGLang serves the apps as they are; its session cache, with sessions
        tagged = lifecycle is Lifecycle.PLUGIN
        ac.configure(base_url=base_url)
        client = openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key="none", max_retries=0)
        apps = DemoApps(
            client,
            model="default",
            system_words=opts.system_words,
            task_words=opts.task_words,
            tool_words=opts.tool_words,
            on_answer=answered,
        )
        recording = ac.record(unrecorded.pop(), name="demo") if tagged and unrecorded else contextlib.nullcontext()
        with recording:
            started = time.monotonic()
            workflows = run_workflows(
                apps,
                opts.workflows,
                opts.concurrency,
                opts.seed,
                lifecycle=lifecycle,
                base_url=base_url,
                headers=headers,
            )
            asyncio.run(workflows)
            makespan = time.monotonic() - started
            if tagged and not ac.flush(END_EVENTS_TIMEOUT_S):  # every end event reaches the server before the next run
                raise BenchError(f"end events still unsent after {END_EVENTS_TIMEOUT_S:.0f} s")
        return apps.records, makespan

    bench = BenchOptions(
        policies=tuple(PolicySpec.parse(p) for p in opts.policies),
        repeat=opts.repeat,
        capacity=opts.capacity,
        model_path=model,
        model_size=opts.model_size,
        port=opts.port,
        log_dir=opts.log_dir,
    )
    how = measure if opts.fresh_servers else measure_on_kept_servers
    return how(
        bench,
        run_apps,
        capacity=opts.capacity,
        vocab_size=vocab_size_of(model),
        warmup_tokens=WARMUP_TOKENS,
        stage=stage,
    )


def measure_on_kept_servers(
    opts: BenchOptions,
    run_workload: WorkloadRunner,
    *,
    capacity: int,
    vocab_size: int,
    warmup_tokens: int,
    stage: Callable[[Stage], None] = lambda _: None,
) -> list[Run]:
    """Every (repetition, policy) in alternating order, each policy's runs on one server started for it (all side
    by side, warmed up once), its cache flushed before each run. `measure`'s contract otherwise."""
    from agentcache.server_ext.launcher import ServerError

    specs = {s.text: s for s in opts.policies}
    order = run_order(list(specs), opts.repeat)
    runs = []
    with contextlib.ExitStack() as stack:
        try:
            servers = start_side_by_side(opts, capacity, stage, len(order))
        except (ServerError, httpx.HTTPError, BenchError) as exc:
            raise BenchError(f"starting the servers: {exc}") from exc
        stack.callback(stop_side_by_side, list(servers.values()))
        stage(Stage(order[0][1], 0, opts.repeat, -1, len(order), f"warming up the {len(servers)} servers"))
        for policy, server in servers.items():
            try:
                warm_up(server.base_url, server.auth_headers(), vocab_size, warmup_tokens, opts.warmup_requests)
            except (httpx.HTTPError, BenchError) as exc:
                raise BenchError(f"{policy}'s server, warming up: {exc}") from exc
        for index, (repetition, policy) in enumerate(order):
            spec, server = specs[policy], servers[policy]
            at = functools.partial(Stage, policy, repetition, opts.repeat, index, len(order))  # at(step): a Stage
            headers = server.auth_headers()
            try:
                stage(at("emptying its cache"))
                flush(server.base_url, headers)
                stage(at("running"))
                sent, makespan = run_measured(run_workload, spec, server.base_url, headers, server.opts.log_path)
            except (httpx.HTTPError, BenchError) as exc:
                raise BenchError(f"{at('').where}: {exc}") from exc
            runs.append(Run(policy, repetition, sent, makespan))
            stage(at("done"))
    return runs


def start_side_by_side(
    opts: BenchOptions, capacity: int, stage: Callable[[Stage], None], runs: int
) -> dict[str, Server]:
    """One server per policy, on consecutive ports from `opts.port`, started at once (a start is mostly imports,
    which overlap); every one stopped if any fails."""
    from agentcache.server_ext.launcher import Server, port_is_free

    specs = list(opts.policies)
    ports = [opts.port + i for i in range(len(specs))]
    taken = [str(p) for p in ports if not port_is_free("127.0.0.1", p)]
    if taken:
        raise BenchError(
            f"port {', '.join(taken)} is in use (the demo's servers take --port and the {len(specs) - 1} after it)"
        )
    servers = {
        spec.text: Server(
            serve_options(
                spec,
                dataclasses.replace(opts, port=port, extra_args=[*KEPT_SERVER_ARGS, *opts.extra_args]),
                capacity,
                spec.text.replace("/", "_"),
            )
        )
        for spec, port in zip(specs, ports)
    }
    ready: list[str] = []
    failures: list[BaseException] = []
    lock = threading.Lock()

    def say() -> None:
        names = ", ".join(servers)
        step = f"starting {len(servers)} SGLang servers side by side ({names}): {len(ready)} ready"
        stage(Stage(specs[0].text, 0, opts.repeat, -1, runs, step))

    def start(server: Server) -> None:
        try:
            server.start()
        except BaseException as exc:  # noqa: BLE001 - the main thread raises it, once every start has ended
            failures.append(exc)
            return
        with lock:
            ready.append(server.opts.policy)
            say()

    say()
    threads = [threading.Thread(target=start, args=(s,), daemon=True) for s in servers.values()]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    except BaseException:  # Ctrl-C while they start: none may be left running on its port
        stop_side_by_side(list(servers.values()))
        raise
    if failures:
        stop_side_by_side(list(servers.values()))
        raise failures[0]
    return servers


def stop_side_by_side(servers: list[Server]) -> None:
    """Stop every server at once: each drains and exits in its own time (up to the launcher's grace)."""
    threads = [threading.Thread(target=s.stop, daemon=True) for s in servers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def flush(base_url: str, headers: dict[str, str]) -> None:
    """Empty the server's cache (SGLang's /flush_cache: the tree and its KV, once no request is left)."""
    r = httpx.post(
        f"{base_url}/flush_cache", params={"timeout": FLUSH_TIMEOUT_S}, headers=headers, timeout=FLUSH_TIMEOUT_S + 30
    )
    if r.is_error:
        raise BenchError(f"the server did not empty its cache (HTTP {r.status_code}): {r.text.strip()[:300]}")
