"""A CrewAI flow with a self-evaluation loop (writer crew, editor crew), wrapped with agentcache's one decorator.

    .venv/bin/python examples/crewai_flow.py --workflows 4 --json

    write_draft (writer crew) -> evaluate (editor crew) -> accepted -> done
          ^                            |
          +--------- revise -----------+   (at most three drafts)

Built the way CrewAI's docs build a self-evaluation flow; the only agentcache
line is the decorator on `solve`. The served model has random weights, so the
editor's verdict is a seeded coin flip, never read from its text, and agents
make exactly one call per task (no tools, one iteration, no retries).
"""

from __future__ import annotations

import os
import tempfile

# CrewAI reads these at import: no telemetry, no version check, files in a temp dir.
_HOME = tempfile.mkdtemp(prefix="agentcache-crewai-")
for _key, _value in {
    "CREWAI_DISABLE_TELEMETRY": "true",
    "CREWAI_DISABLE_TRACKING": "true",
    "OTEL_SDK_DISABLED": "true",
    "CREWAI_DISABLE_VERSION_CHECK": "true",
    "CREWAI_TRACING_ENABLED": "false",
}.items():
    os.environ.setdefault(_key, _value)
os.environ["HOME"] = _HOME
os.environ["CREWAI_STORAGE_DIR"] = os.path.join(_HOME, "storage")

import asyncio  # noqa: E402
import logging  # noqa: E402
import random  # noqa: E402
import shutil  # noqa: E402
from concurrent.futures import ThreadPoolExecutor  # noqa: E402

from _support import parse_args, report, run_workflows, server  # noqa: E402
from crewai import LLM, Agent, Crew, Process, Task  # noqa: E402
from crewai.flow.flow import Flow, listen, router, start  # noqa: E402
from pydantic import BaseModel, PrivateAttr  # noqa: E402

from agentcache.integrations.crewai import workflow  # noqa: E402

logging.getLogger("crewai.llms.base_llm").setLevel(logging.ERROR)  # "approximate token count" notes
MAX_DRAFTS = 3


def one_task_crew(llm: LLM, role: str, goal: str, backstory: str, description: str) -> Crew:
    agent = Agent(
        role=role, goal=goal, backstory=backstory, llm=llm, max_iter=1, max_retry_limit=0, allow_delegation=False
    )
    task = Task(description=description, expected_output="Plain text.", agent=agent)
    return Crew(agents=[agent], tasks=[task], process=Process.sequential, verbose=False)


class Draft(BaseModel):
    topic: str = ""
    seed: str = ""
    draft: str = ""
    feedback: str = ""
    drafts: int = 0


class SelfEvaluation(Flow[Draft]):
    _llm: LLM = PrivateAttr()
    _skip_auto_memory: bool = True  # no LanceDB memory store for a flow that needs none

    def __init__(self, llm: LLM, **kwargs: object):
        super().__init__(suppress_flow_events=True, **kwargs)
        self._llm = llm

    def _run(self, crew: Crew) -> str:
        try:
            return crew.kickoff(
                inputs={"topic": self.state.topic, "draft": self.state.draft, "feedback": self.state.feedback}
            ).raw
        except ValueError as exc:  # CrewAI refuses an empty answer, which a random model can give
            return f"<no output: {exc}>"

    @start("revise")
    def write_draft(self) -> None:
        writer = one_task_crew(
            self._llm,
            "Technical Writer",
            "Write a short, accurate post about {topic}.",
            "You are a senior technical writer who explains complex systems simply.",
            "Write a 150-word post about {topic}. Previous draft: {draft}. Feedback to address: {feedback}",
        )
        self.state.draft = self._run(writer)
        self.state.drafts += 1

    @router(write_draft)
    def evaluate(self) -> str:
        editor = one_task_crew(
            self._llm,
            "Editor",
            "Judge posts about {topic} for accuracy and clarity.",
            "You are a demanding editor at a technical publication.",
            "Review this draft about {topic} and give a score from 1 to 10 with feedback: {draft}",
        )
        self.state.feedback = self._run(editor)
        accepted = random.Random(f"{self.state.seed}:{self.state.drafts}").random() < 0.4
        return "accepted" if accepted or self.state.drafts >= MAX_DRAFTS else "revise"

    @listen("accepted")
    def publish(self) -> str:
        return self.state.draft


async def main() -> None:
    args = parse_args(__doc__.splitlines()[0], workflows=4)
    asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(max_workers=max(8, args.concurrency * 2)))
    with server(args) as base_url:
        # "openai/<model>" with a base_url: CrewAI's own OpenAI provider, i.e. the openai SDK.
        llm = LLM(
            model="openai/default",
            base_url=base_url,
            api_key=args.api_key or "none",
            max_tokens=8,
            temperature=0,
            extra_body={"min_tokens": 2},
        )
        topics = ["KV cache reuse", "radix trees", "continuous batching", "multi-agent workflows"]

        async def solve(i: int) -> None:
            flow = SelfEvaluation(llm)
            await flow.kickoff_async(inputs={"topic": topics[i % len(topics)], "seed": f"{args.seed}:{i}"})

        report(args, await run_workflows(args, solve, workflow, "self-eval"))
    shutil.rmtree(_HOME, ignore_errors=True)


if __name__ == "__main__":
    asyncio.run(main())
