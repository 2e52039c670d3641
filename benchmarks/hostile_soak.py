"""Hostile traffic against the real server: every kind of bad request, many times over, beside honest ones.

    .venv/bin/python benchmarks/hostile_soak.py             # about 4 minutes on 2 cores

Starts the bundled server (CPU dev mode, tiny model, pbkv) and sends rounds of requests that once
crashed the server or grew it (docs/results/reliability.md lists each), interleaved with honest tagged
requests, then checks that the server never restarted and that its processes' memory ends within 10% of
what the same server held quiet after its warm-up: honest requests, then one uncounted round of every kind
(so what a first 1 MB body allocates once counts as warm-up, and only growth counts against the soak).
Prints a table and writes the "Hostile traffic" section of docs/results/reliability.md.
"""

from __future__ import annotations

import argparse
import platform
import random
import time
from collections import Counter

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--port", type=int, default=30400)
    parser.add_argument("--lease", type=float, default=20.0)
    parser.add_argument("--warm-up", type=int, default=40, help="honest requests before the quiet figure")
    parser.add_argument("--only", help="send only the kinds of request whose name contains this")
    parser.add_argument("--no-docs", action="store_true", help="print only; do not touch docs/results/reliability.md")
    args = parser.parse_args()
    console = Console(stderr=True)
    rng = random.Random(0)
    outcomes: Counter[tuple[str, int]] = Counter()
    samples: list[tuple[int, float, float]] = []
    opts = ServeOptions(
        model_size="tiny", port=args.port, max_total_tokens=8000, lease_s=args.lease, log_path="out/hostile-soak.log"
    )
    with Server(opts) as server, httpx.Client(base_url=server.base_url, timeout=300) as client:
        launcher = psutil.Process(server.process.pid)
        (scheduler,) = [p for p in launcher.children(recursive=True) if "scheduler" in " ".join(p.cmdline())]
        pids = {launcher.pid, scheduler.pid}
        warm_up(client, rng, args.warm_up)
        time.sleep(2)
        honest = (rss_mb(launcher), rss_mb(scheduler))
        # One round of every kind, uncounted: the buffers a first 1 MB body or a first batch makes once are then
        # part of the quiet figure, which the end is held to (growth, not first use).
        hostile_round(client, server.base_url, rng, -1, args.only, Counter())
        time.sleep(2)
        quiet = (rss_mb(launcher), rss_mb(scheduler))
        started = time.monotonic()
        with progress("hostile rounds", args.rounds) as bar:
            for round_no in range(args.rounds):
                hostile_round(client, server.base_url, rng, round_no, args.only, outcomes)
                samples.append((round_no + 1, rss_mb(launcher), rss_mb(scheduler)))
                bar.advance()
        time.sleep(args.lease + 5)  # idle: the leases of the never-ended workflows run out on the clock
        stats = client.get("/agentcache/v1/stats").json()
        alive = {launcher.pid, *(p.pid for p in launcher.children(recursive=True))}
        restarts = 0 if pids <= alive and client.get("/agentcache/v1/health").status_code == 200 else 1
        wall = time.monotonic() - started
        samples.append((args.rounds, rss_mb(launcher), rss_mb(scheduler)))  # after the idle wait
    report(args, outcomes, samples, honest, quiet, stats, restarts, wall, console)


def report(args, outcomes, samples, honest, quiet, stats, restarts, wall, console) -> None:  # noqa: ANN001
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
    first, last = samples[0], samples[-1]
    peak_http, peak_sched = max(s[1] for s in samples), max(s[2] for s in samples)
    summary = (
        f"{total[0]:,} requests sent in {wall:.0f} s: {total[1]:,} served, {total[2]:,} refused with a 4xx, "
        f"{total[4]:,} abandoned by the client, {total[3]} server errors, {restarts} server restarts. After the idle wait: "
        f"{stats['active_workflows']} active workflows, {stats.get('expired_workflows', '?')} expired on the clock; "
        f"invalid tags counted by reason: {stats['invalid_tags']}."
    )
    within = all(last[i] <= quiet[i - 1] * (1 + MEMORY_TOLERANCE) for i in (1, 2))
    memory = (
        f"Resident memory, HTTP process: {honest[0]:.0f} MB after a warm-up of {args.warm_up} honest requests, "
        f"{quiet[0]:.0f} MB quiet after one more round of every kind (uncounted), {first[1]:.0f} MB after round 1, "
        f"{last[1]:.0f} MB at the end (peak {peak_http:.0f} MB); scheduler: {honest[1]:.0f} MB, {quiet[1]:.0f} MB "
        f"quiet, {first[2]:.0f} MB -> {last[2]:.0f} MB (peak {peak_sched:.0f} MB). At the end "
        f"{last[1] / quiet[0] - 1:+.1%} (HTTP) and {last[2] / quiet[1] - 1:+.1%} (scheduler) against the quiet server: "
        f"{'within' if within else 'NOT within'} {MEMORY_TOLERANCE:.0%}."
    )
    console.print(summary)
    console.print(memory)
    if args.no_docs:
        return
    step = max(1, len(samples) // 8)
    lines = [
        f"Command: `python benchmarks/hostile_soak.py` ({platform.machine()}, bundled server in CPU dev mode, tiny",
        f"model, pbkv, lease {args.lease:g} s). Each round sends one request of every kind below.",
        "",
        "| request | sent | served (2xx) | refused (4xx) | server error (5xx) | abandoned by the client |",
        "|---|---:|---:|---:|---:|---:|",
        *(f"| {r[0]} | {r[1]} | {r[2]} | {r[3]} | {r[4]} | {r[5]} |" for r in rows),
        "",
        summary,
        "",
        memory,
        "",
        "| after round | HTTP process RSS (MB) | scheduler RSS (MB) |",
        "|---:|---:|---:|",
        *(f"| {n} | {h:.0f} | {s:.0f} |" for n, h, s in samples[::step]),
    ]
    save_section("reliability", "hostile", lines)


if __name__ == "__main__":
    main()
