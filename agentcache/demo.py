"""`agentcache demo`: the bundled server, concurrent multi-agent workflows, LRU against agentcache.

Two small apps written against the plain `openai` SDK and wrapped with the
agentcache SDK's one decorator run concurrently against the bundled SGLang
server: a code assistant with a test-and-retry loop (planner, coder, tester,
analyzer) and a fact checker whose retriever spawns further retrievals before
a verifier decides (and sometimes sends it back). The model is random-weight,
so the apps' branches are decided by a seeded random generator: both policies
see exactly the same workflows. The server runs once with `lru` and once with
`pbkv`; the table compares hit rate and request latency.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

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
class RequestRecord:
    latency_s: float
    prompt_tokens: int
    cached_tokens: int


@dataclass
class DemoApps:
    """The two apps; every LLM call goes through `chat`, which records latency and cached tokens."""

    client: Any  # openai.AsyncOpenAI
    model: str
    system_words: int = 250
    tool_words: int = 60
    max_tokens: int = 8
    tool_pause_s: float = 0.4
    records: list[RequestRecord] = field(default_factory=list)

    async def chat(self, role: str, history: list[dict[str, str]]) -> str:
        import agentcache_sdk as ac

        messages = [{"role": "system", "content": _system_prompt(role, self.system_words)}, *history]
        start = time.perf_counter()
        with ac.agent_name(role):
            response = await self.client.chat.completions.create(
                model=self.model,
                messages=messages,
                max_tokens=self.max_tokens,
                temperature=0,
                tools=TOOLS,
            )
        usage = response.usage
        details = getattr(usage, "prompt_tokens_details", None)
        cached = getattr(details, "cached_tokens", 0) or 0
        self.records.append(RequestRecord(time.perf_counter() - start, usage.prompt_tokens, cached))
        return response.choices[0].message.content or ""

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


async def run_workflows(apps: DemoApps, workflows: int, concurrency: int, seed: int) -> None:
    """Run `workflows` app runs, `concurrency` at a time, each one agentcache workflow."""
    import agentcache_sdk as ac

    semaphore = asyncio.Semaphore(concurrency)

    async def one(i: int) -> None:
        async with semaphore:
            app = apps.code_assistant if i % 2 == 0 else apps.fact_checker
            async with ac.workflow(name="demo"):
                await app(seed * 1000 + i)

    await asyncio.gather(*(one(i) for i in range(workflows)))


def summarize(records: list[RequestRecord]) -> dict[str, float | int]:
    latencies = sorted(r.latency_s for r in records)
    prompt = sum(r.prompt_tokens for r in records)
    return {
        "requests": len(records),
        "hit_rate": sum(r.cached_tokens for r in records) / prompt if prompt else 0.0,
        "mean_latency_s": statistics.fmean(latencies) if latencies else 0.0,
        "p90_latency_s": latencies[min(len(latencies) - 1, int(0.9 * len(latencies)))] if latencies else 0.0,
    }


@dataclass
class DemoOptions:
    policies: tuple[str, ...] = ("lru", "pbkv")
    workflows: int = 12
    concurrency: int = 4
    capacity: int = 9000  # KV tokens: well below the working set, so the policy matters
    seed: int = 0
    port: int = 30000
    model_path: str | None = None
    model_size: str = "small"
    log_dir: str | None = None


def run_demo(opts: DemoOptions, progress: Any = None) -> dict[str, dict[str, float | int]]:
    """Start the server once per policy, run the same workflows, return the summary per policy."""
    import openai

    import agentcache_sdk as ac
    from agentcache.server_ext.launcher import ServeOptions, Server

    results: dict[str, dict[str, float | int]] = {}
    for policy in opts.policies:
        serve = ServeOptions(
            model_path=opts.model_path,
            model_size=opts.model_size,
            policy=policy,
            port=opts.port,
            max_total_tokens=opts.capacity,
            log_path=f"{opts.log_dir}/server-{policy}.log" if opts.log_dir else None,
        )
        if progress:
            progress(f"starting SGLang with policy {policy}")
        with Server(serve) as server:
            ac.configure(base_url=server.base_url)
            client = openai.AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key="none")
            apps = DemoApps(client, model="default")
            if progress:
                progress(f"running {opts.workflows} workflows with policy {policy}")
            asyncio.run(run_workflows(apps, opts.workflows, opts.concurrency, opts.seed))
            results[policy] = summarize(apps.records)
    return results
