"""`agentcache demo`: the bundled server, concurrent multi-agent workflows, SGLang's own strategies against agentcache.

Two small apps written against the plain `openai` SDK and wrapped with the
agentcache SDK's one decorator run concurrently against the bundled SGLang
server: a code assistant with a test-and-retry loop (planner, coder, tester,
analyzer) and a fact checker whose retriever spawns further retrievals before
a verifier decides (and sometimes sends it back). The model is random-weight,
so the apps' branches are decided by a seeded random generator: both policies
see exactly the same workflows.

It runs on the live benchmark's footing (agentcache/bench/): a fresh server
per policy and repetition, warmed up, policies in alternating order, medians
over repetitions with their spread. `lru` (SGLang's default), `lfu` and `slru`
are plain SGLang (`--radix-eviction-policy`) running the apps without
agentcache, what a user has with one flag; `pbkv` is the plugin with the
decorated apps, whose end events all reach the server before it stops. Each
policy is set against lru, and ours also against the best of SGLang's other
strategies in the run.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agentcache.bench.runner import (
    DEFAULT_POLICIES,
    BenchOptions,
    Stage,
    best_sglang_strategy,
    measure,
    runs_on_plain_sglang,
)
from agentcache.bench.runs import Run, paired_ratios
from agentcache.bench.workload import BenchError, Sent
from agentcache.policy import PolicySpec

WORDS = (
    "agent plan code test review tool schema result error retry analyze verify claim evidence search passage "
    "function argument return value python module import class method string integer list dict assert "
    "failure success report summary step task context answer question source document"
).split()

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": f"{name.replace('_', ' ')} for the team",
            "parameters": {"type": "object", "properties": {"input": {"type": "string"}}, "required": ["input"]},
        },
    }
    for name in ("run_tests", "search_web", "read_file", "write_file")
]


def _text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def _system_prompt(role: str, words: int) -> str:
    rng = random.Random(role)  # the same agent always has the same fixed prompt
    return f"You are the {role} of a multi-agent team. " + _text(rng, words)


@dataclass
class DemoApps:
    """The two apps; every LLM call goes through `chat`, which records latency and cached tokens."""

    client: Any  # openai.AsyncOpenAI
    model: str
    system_words: int = 250
    tool_words: int = 60
    max_tokens: int = 8
    tool_pause_s: float = 0.4
    records: list[Sent] = field(default_factory=list)
    on_answer: Callable[[], None] | None = None

    async def chat(self, role: str, history: list[dict[str, str]]) -> str:
        """One streamed call: time to the first token, latency, and the server's own token counts."""
        import agentcache_sdk as ac

        messages = [{"role": "system", "content": _system_prompt(role, self.system_words)}, *history]
        start = time.perf_counter()
        first = None
        text: list[str] = []
        usage = None
        with ac.agent_name(role):
            stream = await self.client.chat.completions.create(
                model=self.model,
                messages=messages,
                max_tokens=self.max_tokens,
                temperature=0,
                tools=TOOLS,
                stream=True,
                stream_options={"include_usage": True},
            )
            async for chunk in stream:
                if chunk.choices and first is None:
                    first = time.perf_counter()
                if chunk.choices and chunk.choices[0].delta.content:
                    text.append(chunk.choices[0].delta.content)
                usage = chunk.usage or usage
        done = time.perf_counter()
        details = getattr(usage, "prompt_tokens_details", None)
        cached = getattr(details, "cached_tokens", 0) or 0
        prompt = usage.prompt_tokens if usage is not None else 0
        self.records.append(Sent((first or done) - start, done - start, prompt, cached))
        if self.on_answer is not None:
            self.on_answer()
        return "".join(text)

    async def tool(self, rng: random.Random, history: list[dict[str, str]], name: str) -> None:
        await asyncio.sleep(self.tool_pause_s * rng.uniform(0.5, 1.5))
        history.append({"role": "user", "content": f"[{name} output] " + _text(rng, self.tool_words)})

    async def code_assistant(self, seed: int) -> None:
        """planner -> coder -> tester, and back through the analyzer while the tests fail (at most 3 rounds)."""
        rng = random.Random(seed)
        history = [{"role": "user", "content": "Task: " + _text(rng, 60)}]
        history.append({"role": "assistant", "content": await self.chat("planner", history)})
        for attempt in range(3):
            history.append({"role": "assistant", "content": await self.chat("coder", history)})
            history.append({"role": "assistant", "content": await self.chat("tester", history)})
            await self.tool(rng, history, "run_tests")
            if attempt == 2 or rng.random() < 0.4:  # the tests passed
                break
            history.append({"role": "assistant", "content": await self.chat("analyzer", history)})

    async def fact_checker(self, seed: int) -> None:
        """decomposer -> retriever hops (each may spawn another) -> verifier, which may ask for more."""
        rng = random.Random(seed)
        history = [{"role": "user", "content": "Claim: " + _text(rng, 50)}]
        history.append({"role": "assistant", "content": await self.chat("decomposer", history)})
        for _round in range(2):
            for _hop in range(3):
                history.append({"role": "assistant", "content": await self.chat("retriever", history)})
                await self.tool(rng, history, "search_web")
                if rng.random() < 0.5:
                    break
            history.append({"role": "assistant", "content": await self.chat("verifier", history)})
            if rng.random() < 0.6:  # enough evidence
                break


async def run_workflows(apps: DemoApps, workflows: int, concurrency: int, seed: int, *, tagged: bool = True) -> None:
    """Run `workflows` app runs, `concurrency` at a time, each one agentcache workflow (untagged: plain apps)."""
    import agentcache_sdk as ac

    semaphore = asyncio.Semaphore(concurrency)

    async def one(i: int) -> None:
        async with semaphore:
            app = apps.code_assistant if i % 2 == 0 else apps.fact_checker
            async with ac.workflow(name="demo") if tagged else contextlib.nullcontext():
                await app(seed * 1000 + i)

    await asyncio.gather(*(one(i) for i in range(workflows)))


@dataclass
class DemoOptions:
    policies: tuple[str, ...] = tuple(DEFAULT_POLICIES.split(","))  # the live bench's: lru, lfu, slru, pbkv
    repeat: int = 3
    workflows: int = 8
    concurrency: int = 4
    # KV tokens: the seven agents' fixed prompts (about 6,600 tokens) fit with room for part of the histories in
    # flight, so the policy chooses which; below the prompts alone every policy thrashes and a run turns on
    # arrival timing, and with room for nearly everything every policy does about the same (docs/results/demo.md).
    capacity: int = 9000
    seed: int = 0
    port: int = 30000
    model_path: str | None = None
    model_size: str = "small"
    log_dir: str | None = None
    record: str | None = None  # a trace file: the first run with agentcache records its traffic there


END_EVENTS_TIMEOUT_S = 30.0


def run_demo(
    opts: DemoOptions, stage: Callable[[Stage], None] = lambda _: None, answered: Callable[[], None] | None = None
) -> list[Run]:
    """Every policy and repetition on a fresh, warmed-up server, the same workflows each time."""
    import openai

    import agentcache_sdk as ac
    from agentcache.bench.runner import vocab_size_of
    from agentcache.server_ext.launcher import ensure_model

    model = ensure_model(opts.model_path, opts.model_size)
    unrecorded = [opts.record] if opts.record else []  # every run serves the same workflows: record one

    def run_apps(base_url: str, headers: dict[str, str], spec: PolicySpec) -> tuple[list[Sent], float]:
        tagged = not runs_on_plain_sglang(spec)  # plain SGLang serves the apps as they are, without agentcache
        ac.configure(base_url=base_url)
        client = openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key="none", max_retries=0)
        apps = DemoApps(client, model="default", on_answer=answered)
        recording = ac.record(unrecorded.pop(), name="demo") if tagged and unrecorded else contextlib.nullcontext()
        with recording:
            started = time.monotonic()
            asyncio.run(run_workflows(apps, opts.workflows, opts.concurrency, opts.seed, tagged=tagged))
            makespan = time.monotonic() - started
            if tagged and not ac.flush(END_EVENTS_TIMEOUT_S):  # every end event reaches the server before it stops
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
    return measure(
        bench, run_apps, capacity=opts.capacity, vocab_size=vocab_size_of(model), warmup_tokens=600, stage=stage
    )


def summarize(runs: list[Run]) -> dict[str, dict[str, float | int]]:
    """Per policy, medians over its repetitions (the keys of `agentcache demo --json`)."""
    out: dict[str, dict[str, float | int]] = {}
    for policy in dict.fromkeys(r.policy for r in runs):
        mine = [r for r in runs if r.policy == policy]
        out[policy] = {
            "hit_rate": statistics.median(r.hit_rate for r in mine),
            "mean_latency_s": statistics.median(r.mean_latency_s for r in mine),
            "p90_latency_s": statistics.median(r.p90_latency_s for r in mine),
            "requests": statistics.median(len(r.sent) for r in mine),
            "runs": len(mine),
        }
    return out


def ratio_lines(runs: list[Run], baseline: str = "lru") -> list[str]:
    """Each policy against the baseline, and each of ours also against the best of SGLang's other strategies in
    the run (by median hit rate): medians of per-repetition ratios, with their range."""
    policies = list(dict.fromkeys(r.policy for r in runs))
    lines = []
    if baseline in policies:
        lines += [_ratio_line(runs, policy, baseline) for policy in policies if policy != baseline]
    best = best_sglang_strategy(runs, besides=(baseline,))
    if best is not None:
        for policy in policies:
            if not runs_on_plain_sglang(PolicySpec.parse(policy)):
                lines.append(_ratio_line(runs, policy, best, f"{best}, the best of SGLang's other strategies here"))
    return lines


def _ratio_line(runs: list[Run], policy: str, baseline: str, named: str | None = None) -> str:
    hit = paired_ratios(runs, policy, baseline, "hit_rate")
    speed = [1.0 / x for x in paired_ratios(runs, policy, baseline, "mean_latency_s")]
    # A small workload's runs differ by which prefixes a few early evictions happen to keep: the count of
    # repetitions won says more than a median of three.
    ahead = sum(x > 1.0 for x in hit)
    return (
        f"{policy}: {statistics.median(hit):.2f}x the hit rate of {named or baseline} [{min(hit):.2f}-{max(hit):.2f}], "
        f"higher in {ahead} of {len(hit)} repetitions; "
        f"{statistics.median(speed):.2f}x faster on mean latency [{min(speed):.2f}-{max(speed):.2f}] "
        f"(medians of {len(speed)} per-repetition ratios, [min-max])"
    )
