"""Hostile traffic against the real server: every kind of bad request, many times over, beside honest ones.

    .venv/bin/python benchmarks/hostile_soak.py             # about 4 minutes on 2 cores

Starts the bundled server (CPU dev mode, tiny model, pbkv) and sends rounds of requests that once
crashed the server or grew it (docs/results/reliability.md lists each), interleaved with honest tagged
requests, then checks that the server never restarted and that its processes' memory stayed flat.
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--port", type=int, default=30400)
    parser.add_argument("--lease", type=float, default=20.0)
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
        started = time.monotonic()
        with progress("hostile rounds", args.rounds) as bar:
            for round_no in range(args.rounds):
                for kind, route, body, headers in hostile_requests(rng, round_no):
                    if args.only and args.only not in kind:
                        continue
                    r = client.post(route, json=body, headers=headers)
                    outcomes[(kind, r.status_code)] += 1
                samples.append((round_no + 1, rss_mb(launcher), rss_mb(scheduler)))
                bar.advance()
        time.sleep(args.lease + 5)  # idle: the leases of the never-ended workflows run out on the clock
        stats = client.get("/agentcache/v1/stats").json()
        alive = {launcher.pid, *(p.pid for p in launcher.children(recursive=True))}
        restarts = 0 if pids <= alive and client.get("/agentcache/v1/health").status_code == 200 else 1
        wall = time.monotonic() - started
    report(args, outcomes, samples, stats, restarts, wall, console)


def report(args, outcomes, samples, stats, restarts, wall, console) -> None:  # noqa: ANN001
    kinds = list(dict.fromkeys(kind for kind, _ in outcomes))
    table = Table(title=f"{args.rounds} rounds of hostile traffic")
    for column in ("request", "sent", "served (2xx)", "refused (4xx)", "server error (5xx)"):
        table.add_column(column, justify="left" if column == "request" else "right")
    rows = []
    for kind in kinds:
        codes = {code: n for (k, code), n in outcomes.items() if k == kind}
        row = (
            kind,
            sum(codes.values()),
            sum(n for c, n in codes.items() if c < 300),
            sum(n for c, n in codes.items() if 400 <= c < 500),
            sum(n for c, n in codes.items() if c >= 500),
        )
        rows.append(row)
        table.add_row(*map(str, row))
    Console().print(table)
    total = [sum(r[i] for r in rows) for i in range(1, 5)]
    first, last = samples[0], samples[-1]
    peak_http, peak_sched = max(s[1] for s in samples), max(s[2] for s in samples)
    summary = (
        f"{total[0]:,} requests sent in {wall:.0f} s: {total[1]:,} served, {total[2]:,} refused with a 4xx, "
        f"{total[3]} server errors, {restarts} server restarts. After the idle wait: "
        f"{stats['active_workflows']} active workflows, {stats.get('expired_workflows', '?')} expired on the clock; "
        f"invalid tags counted by reason: {stats['invalid_tags']}."
    )
    memory = (
        f"Resident memory, HTTP process: {first[1]:.0f} MB after round 1, {last[1]:.0f} MB after round "
        f"{last[0]} (peak {peak_http:.0f} MB); scheduler: {first[2]:.0f} MB -> {last[2]:.0f} MB (peak {peak_sched:.0f} MB)."
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
        "| request | sent | served (2xx) | refused (4xx) | server error (5xx) |",
        "|---|---:|---:|---:|---:|",
        *(f"| {r[0]} | {r[1]} | {r[2]} | {r[3]} | {r[4]} |" for r in rows),
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
