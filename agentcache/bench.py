"""`agentcache bench`: a workload as real concurrent requests against the bundled server, once per policy, fairly.

Fair means what a timing on a shared machine needs to be believed:

- every run starts a fresh server (nothing learned or cached carries over) and warms it up with
  requests that share nothing with the workload, then empties its cache;
- policies run in alternating order over the repetitions (forward, then backward, ...), so no policy
  always runs first on a cold machine or last on a hot one;
- each figure is the median over repetitions with its min and max, and ratios are taken per
  repetition, between runs that ran next to each other.

SGLang's own strategies run exactly as a user would run them: a plain SGLang server, without the
agentcache plugin, started with ``--radix-eviction-policy NAME`` (``lru`` is SGLang's default).
agentcache's policies run on the server with the plugin (``agentcache serve``).

A trace (format v1) drives the requests: each workflow is a coroutine that sends its requests in
order, at the trace's (scaled) send times but never before its previous request finished, through
``/generate`` with token ids made from the segments (the same content id always gives the same ids)
and streamed, so the time to the first token is measured. End events go to the control route (the
plugin's servers only; a plain server has none). The model's own output replaces the trace's outputs,
so output reuse does not carry over: prompts are reused, generated text is not.

Figures per run: hit rate and prompt tokens the server computed (from the server's own usage
report per request), time to first token and request latency (median over the run's requests), and
the run's completion time (first request sent to last answer).
"""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx

from agentcache.policy import PolicySpec
from agentcache.policy.spec import SGLANG_STRATEGIES
from agentcache.trace import End, Request, Trace

DEFAULT_POLICIES = "lru,lfu,slru,pbkv"
# On CPU the engine runs one torch thread: with one per core, a run's timing hinged on whether any other
# process held a core (a spinning thread waiting for a descheduled one made single runs up to 15x slower).
ENGINE_CPU_THREADS = 1
CAPACITY_FACTOR = 10  # default KV capacity: this many mean prompts (with requests in flight holding theirs, tight)
TOKEN_SCALE = 0.35  # default scale of segment sizes: CPU prefill is slow
MAX_NEW_TOKENS = 4  # default cap on tokens generated per request
TIME_SCALE = 0.1  # default scale of the trace's send times


class BenchError(RuntimeError):
    """A bench that cannot run (a server that does not start, a workload that fails): says what and where."""


# ---------------------------------------------------------------- the workload


class TokenMaker:
    """Deterministic token ids per content id, scaled in length, inside the model's vocabulary."""

    def __init__(self, vocab_size: int, scale: float):
        self.low, self.high = 10, max(11, vocab_size - 10)
        self.scale = scale
        self._cache: dict[str, list[int]] = {}

    def segment(self, content_id: str, tokens: int) -> list[int]:
        ids = self._cache.get(content_id)
        if ids is None:
            rng = random.Random(content_id)
            n = scaled_tokens(tokens, self.scale)
            ids = self._cache[content_id] = [rng.randrange(self.low, self.high) for _ in range(n)]
        return ids

    def prompt(self, request: Request) -> tuple[list[int], int]:
        """(token ids, fixed-prompt boundary in tokens)."""
        ids: list[int] = []
        fixed = 0
        for i, seg in enumerate(request.segments):
            ids += self.segment(seg.content_id, seg.tokens)
            if i + 1 == request.fixed:
                fixed = len(ids)
        return ids, fixed


def scaled_tokens(tokens: int, scale: float) -> int:
    return max(1, round(tokens * scale))


def capped_output(output: int, max_new_tokens: int) -> int:
    return max(1, min(output, max_new_tokens))


def as_served(trace: Trace, token_scale: float = TOKEN_SCALE, max_new_tokens: int = MAX_NEW_TOKENS) -> Trace:
    """The trace as a bench run's server sees it, for a replay of exactly that workload: segments scaled as
    TokenMaker scales them, outputs capped as the requests cap them, and no output reused (the model's own
    output replaces the trace's, so a later prompt that re-sends the trace's output computes it afresh)."""
    events: list[Request | End] = []
    for e in trace.events:
        if isinstance(e, Request):
            segments = tuple(s._replace(tokens=scaled_tokens(s.tokens, token_scale)) for s in e.segments)
            e = replace(e, segments=segments, output=capped_output(e.output, max_new_tokens), output_id=None)
        events.append(e)
    return Trace(trace.meta, events)


def first_workflows(trace: Trace, workflows: int | None) -> Trace:
    """The trace cut to its first `workflows` workflows (all of them when None)."""
    if workflows is None:
        return trace
    keep: dict[str, None] = {}
    for e in trace.events:
        if isinstance(e, Request) and e.workflow not in keep:
            if len(keep) == workflows:
                continue
            keep[e.workflow] = None
    return Trace(trace.meta, [e for e in trace.events if e.workflow in keep])


@dataclass
class Sent:
    ttft_s: float
    latency_s: float
    prompt_tokens: int
    cached_tokens: int


@dataclass
class Workload:
    """A trace turned into requests: per workflow, its events with their prompts."""

    trace: Trace
    tokens: TokenMaker
    time_scale: float
    max_new_tokens: int

    @property
    def requests(self) -> int:
        return len(self.trace.requests)

    async def drive(
        self, base_url: str, headers: dict[str, str], *, send_ends: bool, on_answer: Callable[[], None] | None = None
    ) -> tuple[list[Sent], float]:
        """Send the whole workload; every answer, and the completion time (first request to last answer)."""
        by_workflow: dict[str, list[Any]] = {}
        for e in self.trace.events:
            by_workflow.setdefault(e.workflow, []).append(e)
        sent: list[Sent] = []
        start = time.monotonic()
        last_answer = start

        async def run(client: httpx.AsyncClient, events: list[Any]) -> None:
            nonlocal last_answer
            for e in events:
                delay = e.ts * self.time_scale - (time.monotonic() - start)
                if delay > 0:
                    await asyncio.sleep(delay)
                if isinstance(e, End):
                    if send_ends:
                        r = await client.post(f"{base_url}/agentcache/v1/workflows/{e.workflow}/end")
                        r.raise_for_status()
                    continue
                ids, fixed = self.tokens.prompt(e)
                tags = {"v": 1, "workflow": e.workflow, "agent": e.agent, "agent_name": e.agent, "fixed_tokens": fixed}
                params = {
                    "max_new_tokens": capped_output(e.output, self.max_new_tokens),
                    "temperature": 0,
                    "custom_params": {"agentcache": tags},
                }
                sent.append(await generate(client, base_url, {"input_ids": ids, "sampling_params": params}))
                last_answer = max(last_answer, time.monotonic())
                if on_answer is not None:
                    on_answer()

        async with httpx.AsyncClient(timeout=900, headers=headers) as client:
            await asyncio.gather(*(run(client, events) for events in by_workflow.values()))
        return sent, last_answer - start


async def generate(client: httpx.AsyncClient, base_url: str, body: dict[str, Any]) -> Sent:
    """One streamed /generate: time to the first token, latency, and the server's own token counts."""
    started = time.perf_counter()
    first: float | None = None
    meta: dict[str, Any] = {}
    async with client.stream("POST", f"{base_url}/generate", json={**body, "stream": True}) as r:
        if r.status_code != 200:
            raise BenchError(f"{base_url}/generate answered {r.status_code}: {(await r.aread())[:300]!r}")
        async for line in r.aiter_lines():
            if not line.startswith("data:") or line.strip() == "data: [DONE]":
                continue
            chunk = json.loads(line[5:])
            meta = chunk.get("meta_info") or meta
            if first is None and (chunk.get("output_ids") or meta.get("completion_tokens", 0) > 0):
                first = time.perf_counter()
    done = time.perf_counter()
    return Sent(
        ttft_s=(first or done) - started,
        latency_s=done - started,
        prompt_tokens=int(meta.get("prompt_tokens", 0)),
        cached_tokens=int(meta.get("cached_tokens", 0)),
    )


# ---------------------------------------------------------------- runs, measured fairly


@dataclass
class Run:
    policy: str
    repetition: int
    sent: list[Sent]
    makespan_s: float
    errors: int = 0

    @property
    def prompt_tokens(self) -> int:
        return sum(s.prompt_tokens for s in self.sent)

    @property
    def computed_prompt_tokens(self) -> int:
        return sum(s.prompt_tokens - s.cached_tokens for s in self.sent)

    @property
    def hit_rate(self) -> float:
        prompt = self.prompt_tokens
        return sum(s.cached_tokens for s in self.sent) / prompt if prompt else 0.0

    @property
    def ttft_s(self) -> float:
        return statistics.median(s.ttft_s for s in self.sent) if self.sent else 0.0

    @property
    def latency_s(self) -> float:
        return statistics.median(s.latency_s for s in self.sent) if self.sent else 0.0

    @property
    def mean_latency_s(self) -> float:
        return statistics.fmean(s.latency_s for s in self.sent) if self.sent else 0.0

    @property
    def p90_latency_s(self) -> float:
        latencies = sorted(s.latency_s for s in self.sent)
        return latencies[min(len(latencies) - 1, int(0.9 * len(latencies)))] if latencies else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "repetition": self.repetition,
            "requests": len(self.sent),
            "hit_rate": self.hit_rate,
            "computed_prompt_tokens": self.computed_prompt_tokens,
            "ttft_s": self.ttft_s,
            "latency_s": self.latency_s,
            "mean_latency_s": self.mean_latency_s,
            "p90_latency_s": self.p90_latency_s,
            "makespan_s": self.makespan_s,
        }


def run_order(policies: Sequence[str], repeat: int) -> list[tuple[int, str]]:
    """(repetition, policy) in the order they run: forward, backward, forward, ..."""
    order = []
    for r in range(repeat):
        for policy in policies if r % 2 == 0 else reversed(policies):
            order.append((r, policy))
    return order


def spread(values: Iterable[float]) -> dict[str, float]:
    values = list(values)
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def median_range(values: Sequence[float], fmt: str, unit: str = "") -> str:
    """`median [min-max]` of repeated measurements, each number in format `fmt`, `unit` after the median."""
    return f"{statistics.median(values):{fmt}}{unit} [{min(values):{fmt}}-{max(values):{fmt}}]"


def summarize(runs: Sequence[Run]) -> dict[str, dict[str, Any]]:
    """The JSON contract: per policy, medians (with min and max) over its repetitions."""
    out: dict[str, dict[str, Any]] = {}
    for policy in dict.fromkeys(r.policy for r in runs):
        mine = sorted((r for r in runs if r.policy == policy), key=lambda r: r.repetition)
        out[policy] = {
            "hit_rate": statistics.median(r.hit_rate for r in mine),
            "computed_prompt_tokens": statistics.median(r.computed_prompt_tokens for r in mine),
            "runs": len(mine),
            "requests": len(mine[0].sent),
            "ttft_s": spread(r.ttft_s for r in mine),
            "latency_s": spread(r.latency_s for r in mine),
            "makespan_s": spread(r.makespan_s for r in mine),
            "repetitions": [r.to_json() for r in mine],
        }
    return out


def paired_ratios(runs: Sequence[Run], policy: str, baseline: str, metric: str) -> list[float]:
    """`policy`'s metric over `baseline`'s, per repetition (runs of one repetition ran next to each other)."""
    by = {(r.policy, r.repetition): getattr(r, metric) for r in runs}
    reps = sorted({r.repetition for r in runs})
    return [by[(policy, i)] / by[(baseline, i)] for i in reps if by.get((baseline, i))]


# ---------------------------------------------------------------- servers


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


def runs_on_plain_sglang(spec: PolicySpec) -> bool:
    """SGLang's own strategies (lru included) run on a server without the plugin, as a user would run them."""
    return spec.name in SGLANG_STRATEGIES and (spec.builtin or spec.name == "lru")


def serve_options(spec: PolicySpec, opts: BenchOptions, capacity: int, run_name: str) -> Any:
    from agentcache.server_ext.launcher import ServeOptions

    plain = runs_on_plain_sglang(spec)
    return ServeOptions(
        model_path=opts.model_path,
        model_size=opts.model_size,
        policy=spec.text,
        plugin=not plain,
        cpu=opts.cpu,
        port=opts.port,
        max_total_tokens=capacity,
        extra_args=[*(["--radix-eviction-policy", spec.name] if plain else []), *opts.extra_args],
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
        client.post("/flush_cache").raise_for_status()


WorkloadRunner = Callable[[str, dict[str, str], PolicySpec], tuple[list[Sent], float]]


def measure(
    opts: BenchOptions,
    run_workload: WorkloadRunner,
    *,
    capacity: int,
    vocab_size: int,
    warmup_tokens: int,
    stage: Callable[[str], None] = lambda _: None,
) -> list[Run]:
    """Every (repetition, policy) on a fresh, warmed-up server, in alternating order.

    `run_workload(base_url, headers, spec)` sends the workload and returns every answer and the
    completion time; `stage` hears what is happening, for a progress display.
    """
    from agentcache.server_ext.launcher import Server, ServerError

    specs = {s.text: s for s in opts.policies}
    runs = []
    for repetition, policy in run_order(list(specs), opts.repeat):
        spec = specs[policy]
        name = f"{policy.replace('/', '_')}-{repetition + 1}"
        where = f"{policy} (repetition {repetition + 1} of {opts.repeat})"
        stage(f"{where}: starting {'SGLang' if runs_on_plain_sglang(spec) else 'SGLang with agentcache'}")
        options = serve_options(spec, opts, capacity, name)
        try:
            with Server(options) as server:
                headers = server.auth_headers()
                stage(f"{where}: warming up")
                warm_up(server.base_url, headers, vocab_size, warmup_tokens, opts.warmup_requests)
                stage(f"{where}: running")
                sent, makespan = run_workload(server.base_url, headers, spec)
                stats = {} if runs_on_plain_sglang(spec) else server_stats(server.base_url, headers)
        except (ServerError, httpx.HTTPError, BenchError) as exc:
            raise BenchError(f"{where}: {exc}") from exc
        if stats.get("policy_faults"):  # a policy that raised is no measure of the policy
            log = f" (log: {options.log_path})" if options.log_path else ""
            raise BenchError(
                f"{where}: the policy raised during the run (in {', '.join(stats['policy_faults'])}); the server"
                f" ran it as {stats['policy']!r}{log}"
            )
        runs.append(Run(policy, repetition, sent, makespan))
    return runs


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
    stage: Callable[[str], None] = lambda _: None,
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

    def run_workload(base_url: str, headers: dict[str, str], spec: PolicySpec) -> tuple[list[Sent], float]:
        send_ends = not runs_on_plain_sglang(spec)
        return asyncio.run(workload.drive(base_url, headers, send_ends=send_ends, on_answer=answered))

    runs = measure(opts, run_workload, capacity=capacity, vocab_size=vocab, warmup_tokens=int(mean_prompt), stage=stage)
    return runs, capacity


# ---------------------------------------------------------------- report


def plot(runs: Sequence[Run], path: str, title: str) -> None:
    """Distributions of time to first token and request latency per policy, over all its repetitions."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    policies = list(dict.fromkeys(r.policy for r in runs))
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, metric, label in ((axes[0], "ttft_s", "time to first token (s)"), (axes[1], "latency_s", "latency (s)")):
        data = [[getattr(s, metric) for r in runs if r.policy == p for s in r.sent] for p in policies]
        ax.boxplot(data, showfliers=False)
        ax.set_xticks(range(1, len(policies) + 1), policies)
        ax.set_ylabel(label)
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def best_sglang_strategy(runs: Sequence[Run], besides: Sequence[str] = ("lru",)) -> str | None:
    """The best by median hit rate of the SGLang strategies that ran (on plain SGLang), `besides` aside; the first
    listed on a tie; None where none ran."""
    policies = dict.fromkeys(r.policy for r in runs)
    others = [p for p in policies if p not in besides and runs_on_plain_sglang(PolicySpec.parse(p))]
    if not others:
        return None
    return max(others, key=lambda p: statistics.median(r.hit_rate for r in runs if r.policy == p))


def comparisons(runs: Sequence[Run], ours: str = "pbkv") -> list[str]:
    """Plain sentences: `ours` against lru and against the best of SGLang's other strategies, per repetition."""
    policies = list(dict.fromkeys(r.policy for r in runs))
    if ours not in policies:
        return []
    builtins = [p for p in policies if p != ours and runs_on_plain_sglang(PolicySpec.parse(p))]
    lines = []
    for base in builtins:
        tokens = paired_ratios(runs, ours, base, "computed_prompt_tokens")
        ttft = paired_ratios(runs, ours, base, "ttft_s")
        makespan = paired_ratios(runs, ours, base, "makespan_s")
        fewer = sum(t < 1.0 for t in tokens)
        lines.append(
            f"{ours} vs {base}: computed {statistics.median(tokens):.2f}x the prompt tokens (fewer in {fewer} of "
            f"{len(tokens)} repetitions); time to first token {median_range(ttft, '.2f', 'x')}, completion time "
            f"{median_range(makespan, '.2f', 'x')} (medians of per-repetition ratios, [min-max])"
        )
    best = best_sglang_strategy(runs, besides=("lru", ours))
    if best is not None:
        lines.append(f"best of SGLang's other strategies by hit rate: {best}")
    return lines
