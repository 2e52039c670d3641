"""What a prompt token costs the live server in time: is prefill a large share of a request's time to first token?

    .venv/bin/python benchmarks/prefill_cost.py                      # the bench's model (small), about 30 seconds
    .venv/bin/python benchmarks/prefill_cost.py --model-size medium

Starts the bundled server (plain SGLang, CPU dev mode without a GPU, the live bench's engine settings),
warms it up, and sends one request at a time, so that nothing queues: per prompt size, a prompt that is
wholly cached (the same prompt again) and a fresh one, alternately. The difference of their times to
first token is what a cache hit on those prompt tokens saves; its share of the fresh request's time says
how much a policy that computes fewer prompt tokens can save on this server, before any queueing. Writes
docs/prefill-cost.md.
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import random
import statistics

import httpx
from rich.console import Console
from rich.progress import Progress
from rich.table import Table
from suite import DOCS

from agentcache.bench.runner import ENGINE_CPU_THREADS, vocab_size_of, warm_up
from agentcache.bench.workload import generate
from agentcache.server_ext.launcher import ServeOptions, Server, ensure_model

MAX_NEW_TOKENS = 1  # the time to first token is all this measures


async def measure(base_url: str, vocab: int, sizes: list[int], repeat: int, advance) -> dict[int, dict[str, list]]:
    rng = random.Random(0)
    times: dict[int, dict[str, list]] = {size: {"cached": [], "fresh": []} for size in sizes}

    def prompt(size: int) -> list[int]:
        return [rng.randrange(10, vocab - 10) for _ in range(size)]

    async with httpx.AsyncClient(timeout=600) as client:
        for size in sizes:
            cached = prompt(size)
            params = {"max_new_tokens": MAX_NEW_TOKENS, "temperature": 0}
            await generate(client, base_url, {"input_ids": cached, "sampling_params": params})  # now it is cached
            for _ in range(repeat):
                for kind, ids in (("cached", cached), ("fresh", prompt(size))):
                    sent = await generate(client, base_url, {"input_ids": ids, "sampling_params": params})
                    if kind == "cached" and sent.cached_tokens < size - 1:
                        raise SystemExit(f"the repeated {size}-token prompt was not served from cache")
                    times[size][kind].append(sent.ttft_s)
                    advance()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-size", default="small", choices=("tiny", "small", "medium", "large"))
    parser.add_argument("--sizes", default="250,1000,4000", help="prompt sizes in tokens, comma-separated")
    parser.add_argument("--repeat", type=int, default=10, help="requests of each kind per size")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    console = Console(stderr=True)
    model = ensure_model(None, args.model_size)
    vocab = vocab_size_of(model)
    opts = ServeOptions(
        model_path=model,
        model_size=args.model_size,
        plugin=False,
        max_total_tokens=4 * max(sizes) + 8000,
        cpu_threads=ENGINE_CPU_THREADS,
    )
    with Progress(console=console) as progress:
        task = progress.add_task("starting the server", total=None)
        with Server(opts) as server:
            progress.update(task, description="warming up")
            warm_up(server.base_url, {}, vocab, 600, 3)
            progress.update(task, description="one request at a time", total=2 * args.repeat * len(sizes))
            times = asyncio.run(measure(server.base_url, vocab, sizes, args.repeat, lambda: progress.advance(task)))

    table = Table(title=f"time to first token, one request at a time ({args.model_size} model)")
    rows = []
    for column in ("prompt tokens", "cached (ms)", "fresh (ms)", "a hit saves (ms per 1,000 tokens)", "share saved"):
        table.add_column(column, justify="right")
    for size in sizes:
        cached = statistics.median(times[size]["cached"]) * 1e3
        fresh = statistics.median(times[size]["fresh"]) * 1e3
        spread = (min(times[size]["fresh"]) * 1e3, max(times[size]["fresh"]) * 1e3)
        row = (
            f"{size:,}",
            f"{cached:.1f}",
            f"{fresh:.1f} [{spread[0]:.1f}-{spread[1]:.1f}]",
            f"{(fresh - cached) / size * 1e3:.1f}",
            f"{(fresh - cached) / fresh:.0%}",
        )
        table.add_row(*row)
        rows.append(row)
    Console().print(table)
    command = "`.venv/bin/python benchmarks/prefill_cost.py" + (
        f" --model-size {args.model_size}`" if args.model_size != "small" else "`"
    )
    page = [
        "# What a prompt token costs the live server",
        "",
        f"Command: {command} ({platform.machine()}, 2 cores, no GPU, one torch thread",
        "as the live bench runs it). Plain SGLang 0.5.23 in CPU dev mode, the random-weight",
        f"{args.model_size} model; one request at a time, so nothing queues; per prompt size, a wholly cached",
        f"prompt and a fresh one alternately, {args.repeat} of each; medians, the fresh ones' [min-max].",
        "`a hit saves`: the fresh request's time to first token less the cached one's, per 1,000 prompt",
        "tokens; `share saved`: that difference as a share of the fresh request's time.",
        "",
        "| " + " | ".join(c.header for c in table.columns) + " |",
        "|" + "---:|" * len(table.columns),
        *("| " + " | ".join(row) + " |" for row in rows),
        "",
    ]
    if opts.cpu_mode:
        page += [
            "A cached token is not free here. SGLang's attention backends for CPU (torch_native, which the",
            "bundled server runs, and flex_attention) compute an extend's attention over the whole sequence,",
            "the cached prefix included (a query padded to the full length: `per_req_query_redudant` in",
            "torch_native_backend.py), so a hit saves a token's projections and MLP but not its attention,",
            "whose cost grows with the square of the prompt: the cached column grows faster than the",
            "prompt. GPU backends (FlashInfer, Triton, FlashAttention) attend from the new tokens only, and",
            "there a cached token costs next to nothing. Live benchmarks on this CPU server therefore show",
            "less time saved per prompt token saved than a GPU would.",
            "",
        ]
    name = "prefill-cost" if args.model_size == "small" else f"prefill-cost-{args.model_size}"
    (DOCS / f"{name}.md").write_text("\n".join(page))
    console.print(f"wrote docs/{name}.md")


if __name__ == "__main__":
    main()
