"""Hostile traffic against the real server: every kind of bad request, many times over, beside honest ones.

    .venv/bin/python benchmarks/hostile_soak.py             # about 6 minutes on 2 cores

Starts two bundled servers (CPU dev mode, tiny model, pbkv) and gives both the same warm-up: honest requests,
then one uncounted round of every kind (so what a first 1 MB body allocates once is warm-up, not growth). Then
one gets rounds of requests that once crashed the server or grew it (docs/results/reliability.md lists each),
interleaved with honest tagged requests, while its twin stays quiet; both are sampled at the same moments. It
checks that the hostile server never restarted and that its HTTP and scheduler processes end within 10% of the
quiet twin's (issue 55): the twin has whatever a server gains with time alone, so the difference is what the
hostile traffic left. Both run with the CPU engine's kernel caches off (ENGINE_KERNEL_CACHES; on with
--engine-kernel-caches). Prints a table and writes the "Hostile traffic" section of
docs/results/reliability.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from statistics import mean

import httpx
import psutil
from pages import progress, save_section
from rich.console import Console
from rich.table import Table

from agentcache.server_ext.launcher import ServeOptions, Server

CHAT = "/v1/chat/completions"


def ids(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(10, 600) for _ in range(n)]


def hostile_requests(rng: random.Random, round_no: int) -> list[tuple[str, str, dict, dict]]:
    """(kind, route, body, headers) of one round."""
    chat = {"model": "default", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 2}
    big_system = f"round {round_no} " + "policy text " * 90_000  # ~1 MB, different every round
    tag = {"v": 1, "workflow": f"honest-{round_no}", "agent": "a:soak"}
    return [
        ("empty prompt in a batch", "/generate", {"input_ids": [[]], "sampling_params": {"max_new_tokens": 2}}, {}),
        (
            "top log-probs beyond the vocabulary",
            "/generate",
            {"input_ids": ids(rng, 8), "return_logprob": True, "top_logprobs_num": 10**6, "sampling_params": {}},
            {},
        ),
        ("out-of-vocabulary ids", "/generate", {"input_ids": [5, 10**7], "sampling_params": {}}, {}),
        ("tag header nested 2,000 deep", CHAT, chat, {"x-request-id-agentcache": "[" * 2000 + "]" * 2000}),
        ("tag header not JSON", CHAT, chat, {"x-request-id-agentcache": "{" + "x" * rng.randrange(1, 5000)}),
        (
            "nested tags in the body",
            "/generate",
            {
                "input_ids": ids(rng, 8),
                "sampling_params": {"max_new_tokens": 1, "custom_params": {"agentcache": {"v": 1, "x": [[1]]}}},
            },
            {},
        ),
        (
            "tags naming thousands of agents",
            "/generate",
            {
                "input_ids": ids(rng, 8),
                "sampling_params": {
                    "max_new_tokens": 1,
                    "custom_params": {
                        "agentcache": {**tag, "workflow": "one-for-all", "agent": f"a:{rng.getrandbits(64):x}"}
                    },
                },
            },
            {},
        ),
        (
            "a new agent name at every request, one shared prefix",
            "/generate",
            {
                "input_ids": ids(random.Random("shared"), 32) + ids(rng, 8),
                "sampling_params": {
                    "max_new_tokens": 1,
                    "custom_params": {
                        "agentcache": {
                            **tag,
                            "workflow": "many-names",
                            "agent_name": f"n{rng.getrandbits(64):x}",
                            "fixed_tokens": 32,
                        }
                    },
                },
            },
            {},
        ),
        (
            "1 MB system prompt over the context length",
            CHAT,
            {
                "model": "default",
                "messages": [{"role": "system", "content": big_system}, {"role": "user", "content": "hi"}],
                "max_tokens": 2,
                "custom_params": {"agentcache": {**tag, "fixed_messages": 1}},
            },
            {},
        ),
        (
            "n = 4 samples of a tagged chat",
            CHAT,
            {**chat, "n": 4, "custom_params": {"agentcache": {**tag, "workflow": f"samples-{round_no}"}}},
            {},
        ),
        (
            "a batch whose boundary one prompt cannot hold",
            "/v1/completions",
            {
                "model": "default",
                "max_tokens": 1,
                "prompt": [ids(rng, 60), ids(rng, 10)],
                "custom_params": {"agentcache": {**tag, "fixed_tokens": 40}},
            },
            {},
        ),
        (
            "fixed_chars on a 200 KB text over the context length",
            "/generate",
            {
                "text": big_system[:200_000],
                "sampling_params": {"max_new_tokens": 1, "custom_params": {"agentcache": {**tag, "fixed_chars": 1}}},
            },
            {},
        ),
        (
            "honest tagged request",
            "/generate",
            {
                "input_ids": ids(random.Random("system"), 200) + ids(rng, 100),
                "sampling_params": {
                    "max_new_tokens": 2,
                    "custom_params": {"agentcache": {**tag, "fixed_tokens": 200}},
                },
            },
            {},
        ),
        (
            "never-ended workflow",
            "/generate",
            {
                "input_ids": ids(rng, 50),
                "sampling_params": {
                    "max_new_tokens": 1,
                    "custom_params": {"agentcache": {**tag, "workflow": f"forgotten-{round_no}"}},
                },
            },
            {},
        ),
    ]


def rss_mb(process: psutil.Process) -> float:
    return process.memory_info().rss / 2**20


MEMORY_TOLERANCE = 0.10  # issue 55: within 10% of the quiet server's memory after the same warm-up
ABANDONED_PER_ROUND = 25  # requests a client gives up on 50 ms after sending (queued or running: aborted)
FLOOD_PER_ROUND = 25  # invented workflow ids and agent names, under a sub-tenant label of their own
# torch's CPU engine keeps a compiled matrix kernel per shape, in two caches of 1,024 (torch's and oneDNN's; ~0.27 MB
# each, measured): every distinct number of tokens in a batch adds ~0.5 MB to the scheduler, up to ~0.5 GB, from
# honest traffic as much as hostile, and more under load (bigger, more varied batches). Off in both servers, so
# that the figure is what the server keeps; a GPU engine has no such caches.
ENGINE_KERNEL_CACHES = {"LRU_CACHE_CAPACITY": "1", "ONEDNN_PRIMITIVE_CACHE_CAPACITY": "0"}


def warm_up(client: httpx.Client, rng: random.Random, requests: int) -> None:
    """Honest tagged requests, one workflow each, ended: what the quiet figure and the soak both start from."""
    for i in range(requests):
        tag = {"v": 1, "workflow": f"warm-{i}", "agent": "a:warm", "fixed_tokens": 200}
        body = {
            "input_ids": ids(random.Random("system"), 200) + ids(rng, 100),
            "sampling_params": {"max_new_tokens": 2, "custom_params": {"agentcache": tag}},
        }
        client.post("/generate", json=body).raise_for_status()
        client.post(f"/agentcache/v1/workflows/warm-{i}/end")


def abandon(base_url: str, rng: random.Random, round_no: int, outcomes: Counter) -> None:
    """Requests given up 50 ms after sending, tagged and untagged, sent at once (issue 55, case 2)."""
    with httpx.Client(base_url=base_url, timeout=httpx.Timeout(0.05, connect=5.0)) as impatient:
        for i in range(ABANDONED_PER_ROUND):
            params: dict = {"max_new_tokens": 64, "ignore_eos": True}
            if i % 2:
                params["custom_params"] = {"agentcache": {"v": 1, "workflow": f"gone-{round_no}", "agent": "a:gone"}}
            try:
                r = impatient.post("/generate", json={"input_ids": ids(rng, 200), "sampling_params": params})
                outcomes[("request abandoned after 50 ms", r.status_code)] += 1
            except httpx.TimeoutException:
                outcomes[("request abandoned after 50 ms", 0)] += 1


def hostile_round(
    client: httpx.Client, base_url: str, rng: random.Random, round_no: int, only: str | None, outcomes: Counter
) -> None:
    for kind, route, body, headers in hostile_requests(rng, round_no):
        if only and only not in kind:
            continue
        r = client.post(route, json=body, headers=headers)
        outcomes[(kind, r.status_code)] += 1
    if not only or "abandoned" in only:
        abandon(base_url, rng, round_no, outcomes)
    if not only or "flood" in only:
        flood(client, rng, round_no, outcomes)


def flood(client: httpx.Client, rng: random.Random, round_no: int, outcomes: Counter) -> None:
    """New workflow ids and agent names under one sub-tenant label, never ended (issue 55, case 5)."""
    for i in range(FLOOD_PER_ROUND):
        tag = {"v": 1, "workflow": f"flood-{round_no}-{i}", "agent": f"a:{rng.getrandbits(64):x}"}
        body = {
            "input_ids": ids(rng, 16),
            "sampling_params": {"max_new_tokens": 1, "custom_params": {"agentcache": tag}},
        }
        r = client.post("/generate", json=body, headers={"x-agentcache-tenant": "flood"})
        outcomes[("flood of new workflow ids and agent names", r.status_code)] += 1


class Watched:
    """A running server's HTTP process (SGLang's launcher) and scheduler, to sample their memory."""

    def __init__(self, server: Server):
        self.server = server
        self.launcher = psutil.Process(server.process.pid)
        (self.scheduler,) = [p for p in self.launcher.children(recursive=True) if "scheduler" in " ".join(p.cmdline())]
        self.pids = {self.launcher.pid, self.scheduler.pid}

    def rss(self) -> tuple[float, float]:
        return rss_mb(self.launcher), rss_mb(self.scheduler)

    def restarted(self, client: httpx.Client) -> bool:
        alive = {self.launcher.pid, *(p.pid for p in self.launcher.children(recursive=True))}
        return not self.pids <= alive or client.get("/agentcache/v1/health").status_code != 200


def start_both(args: argparse.Namespace, stack: ExitStack) -> tuple[Server, Server]:
    """The hostile server and its quiet twin, started side by side; both stopped when `stack` closes."""
    servers = [
        Server(
            ServeOptions(
                model_size="tiny",
                port=port,
                max_total_tokens=8000,
                lease_s=args.lease,
                log_path=f"out/hostile-soak{suffix}.log",
            )
        )
        for port, suffix in ((args.port, ""), (args.port + 1, "-quiet"))
    ]
    for server in servers:
        stack.callback(server.stop)
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(Server.start, servers))
    return servers[0], servers[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--port", type=int, default=30400, help="the hostile server's; its quiet twin's is the next")
    parser.add_argument("--lease", type=float, default=20.0)
    parser.add_argument("--warm-up", type=int, default=40, help="honest requests before the quiet figure")
    parser.add_argument("--only", help="send only the kinds of request whose name contains this")
    parser.add_argument(
        "--engine-kernel-caches", action="store_true", help="keep torch's per-shape kernel caches (see the page)"
    )
    parser.add_argument("--no-docs", action="store_true", help="print only; do not touch docs/results/reliability.md")
    args = parser.parse_args()
    if not args.engine_kernel_caches:
        os.environ.update(ENGINE_KERNEL_CACHES)  # the servers inherit the environment
    console = Console(stderr=True)
    outcomes: Counter[tuple[str, int]] = Counter()
    samples: list[tuple[int, float, float, float, float]] = []  # round, hostile HTTP and scheduler, twin's
    with ExitStack() as stack:
        console.print("starting the hostile server and its quiet twin")
        hostile_server, twin_server = start_both(args, stack)
        client = stack.enter_context(httpx.Client(base_url=hostile_server.base_url, timeout=300))
        twin_client = stack.enter_context(httpx.Client(base_url=twin_server.base_url, timeout=300))
        hostile, twin = Watched(hostile_server), Watched(twin_server)
        # The same warm-up for both, request for request: honest requests, then one round of every kind.
        with progress("warm-up, both servers", 2 * (args.warm_up + 1)) as bar:
            for c, server in ((client, hostile_server), (twin_client, twin_server)):
                warm_up(c, random.Random(0), args.warm_up)
                bar.advance(args.warm_up)
                hostile_round(c, server.base_url, random.Random(1), -1, args.only, Counter())
                bar.advance()
        time.sleep(2)
        quiet = hostile.rss()  # the hostile server's own figure before its rounds
        rng = random.Random(2)
        loads: list[float] = []  # the machine's 1-minute load average after each round: others' work shows here
        started = time.monotonic()
        with progress("hostile rounds", args.rounds) as bar:
            for round_no in range(args.rounds):
                hostile_round(client, hostile_server.base_url, rng, round_no, args.only, outcomes)
                samples.append((round_no + 1, *hostile.rss(), *twin.rss()))
                loads.append(os.getloadavg()[0])
                bar.advance()
        time.sleep(args.lease + 5)  # idle: the leases of the never-ended workflows run out on the clock
        stats = client.get("/agentcache/v1/stats").json()
        restarts = int(hostile.restarted(client))
        wall = time.monotonic() - started
        samples.append((args.rounds, *hostile.rss(), *twin.rss()))  # after the idle wait, both at once
    report(args, outcomes, samples, quiet, stats, restarts, wall, mean(loads), console)


def report(args, outcomes, samples, quiet, stats, restarts, wall, load, console) -> None:  # noqa: ANN001
    kinds = list(dict.fromkeys(kind for kind, _ in outcomes))
    table = Table(title=f"{args.rounds} rounds of hostile traffic")
    for column in ("request", "sent", "served (2xx)", "refused (4xx)", "server error (5xx)", "abandoned"):
        table.add_column(column, justify="left" if column == "request" else "right")
    rows = []
    for kind in kinds:
        codes = {code: n for (k, code), n in outcomes.items() if k == kind}
        row = (
            kind,
            sum(codes.values()),
            sum(n for c, n in codes.items() if 200 <= c < 300),
            sum(n for c, n in codes.items() if 400 <= c < 500),
            sum(n for c, n in codes.items() if c >= 500),
            codes.get(0, 0),  # the client gave up before an answer
        )
        rows.append(row)
        table.add_row(*map(str, row))
    Console().print(table)
    total = [sum(r[i] for r in rows) for i in range(1, 6)]
    last = samples[-1]
    summary = (
        f"{total[0]:,} requests sent in {wall:.0f} s: {total[1]:,} served, {total[2]:,} refused with a 4xx, "
        f"{total[4]:,} abandoned by the client, {total[3]} server errors, {restarts} server restarts. After the idle wait: "
        f"{stats['active_workflows']} active workflows, {stats.get('expired_workflows', '?')} expired on the clock; "
        f"invalid tags counted by reason: {stats['invalid_tags']}."
    )
    _, http, sched, twin_http, twin_sched = last
    within = http <= twin_http * (1 + MEMORY_TOLERANCE) and sched <= twin_sched * (1 + MEMORY_TOLERANCE)
    memory = (
        f"Resident memory at the end, against the quiet twin at the same moment: HTTP process {http:.0f} MB against "
        f"{twin_http:.0f} MB ({http / twin_http - 1:+.1%}), scheduler {sched:.0f} MB against {twin_sched:.0f} MB "
        f"({sched / twin_sched - 1:+.1%}): {'within' if within else 'NOT within'} {MEMORY_TOLERANCE:.0%}. Against "
        f"the hostile server's own figure before its rounds ({quiet[0]:.0f} MB and {quiet[1]:.0f} MB): "
        f"{http / quiet[0] - 1:+.1%} and {sched / quiet[1] - 1:+.1%}; peaks {max(s[1] for s in samples):.0f} MB "
        f"and {max(s[2] for s in samples):.0f} MB. The engine's kernel caches were "
        f"{'on (torch defaults)' if args.engine_kernel_caches else 'off in both servers'}; the machine's load "
        f"average during the rounds was {load:.1f} on {os.cpu_count()} cores."
    )
    console.print(summary)
    console.print(memory)
    if args.no_docs:
        return
    step = max(1, len(samples) // 8)
    lines = [
        f"Command: `python benchmarks/hostile_soak.py` ({platform.machine()}, two bundled servers in CPU dev mode, tiny",
        f"model, pbkv, lease {args.lease:g} s). Both get the same warm-up ({args.warm_up} honest requests, then one",
        "uncounted round of every kind); then one gets the rounds, one request of every kind below each, while its",
        "twin stays quiet. The memory clause of issue 55 is held against the twin, sampled at the same moments: it",
        "has whatever a server gains with time alone (SGLang's and the plugin's own caches filling, lazy imports),",
        "so what is left is what the hostile traffic kept. Both run with torch's per-shape CPU kernel caches off",
        "(`LRU_CACHE_CAPACITY=1`, `ONEDNN_PRIMITIVE_CACHE_CAPACITY=0`; `--engine-kernel-caches` keeps them): they keep",
        "a compiled matrix kernel per shape, ~0.5 MB for each distinct number of tokens in a batch, up to ~0.5 GB,",
        "whether the traffic is honest or not, and a GPU engine has none.",
        "",
        "| request | sent | served (2xx) | refused (4xx) | server error (5xx) | abandoned by the client |",
        "|---|---:|---:|---:|---:|---:|",
        *(f"| {r[0]} | {r[1]} | {r[2]} | {r[3]} | {r[4]} | {r[5]} |" for r in rows),
        "",
        summary,
        "",
        memory,
        "",
        "| after round | HTTP process RSS (MB) | quiet twin's | scheduler RSS (MB) | quiet twin's |",
        "|---:|---:|---:|---:|---:|",
        *(f"| {n} | {h:.0f} | {th:.0f} | {s:.0f} | {ts:.0f} |" for n, h, s, th, ts in samples[::step]),
    ]
    save_section("reliability", "hostile", lines)


if __name__ == "__main__":
    main()
