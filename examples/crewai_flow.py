"""A CrewAI flow with a self-evaluation loop (writer crew with a tool, editor crew), with agentcache's decorator.

    .venv/bin/python examples/crewai_flow.py --workflows 4 --json

    write_draft (writer crew) -> evaluate (editor crew) -> accepted -> done
          ^                            |
          +--------- revise -----------+   (at most three drafts)

Built the way CrewAI's docs build a self-evaluation flow; the only agentcache
line is the decorator on `solve`, whose integration reports each tool call
from CrewAI's tool hooks. The served model has random weights, so the editor's
verdict is a seeded coin flip, never read from its text, and agents make
exactly the calls the script gives them (no retries): the editor one per task;
the writer, which has a `check_facts` tool, two: its model's first answer is
scripted to call the tool (random weights never ask for one; a custom LLM,
as CrewAI's docs write one, sends the real request and then answers with the
call), the tool takes a seeded fraction of a second, and the writer's second
call reads its result.
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
import json  # noqa: E402
import logging  # noqa: E402
import random  # noqa: E402
import shutil  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from concurrent.futures import ThreadPoolExecutor  # noqa: E402
from typing import Any  # noqa: E402

from _support import parse_args, report, run_workflows, server  # noqa: E402
from crewai import LLM, Agent, Crew, Process, Task  # noqa: E402
from crewai.flow.flow import Flow, listen, router, start  # noqa: E402
from crewai.llms.base_llm import BaseLLM  # noqa: E402
from crewai.tools import tool  # noqa: E402
from openai.types.chat.chat_completion_message_function_tool_call import (  # noqa: E402
    ChatCompletionMessageFunctionToolCall,
    Function,
)
from pydantic import BaseModel, PrivateAttr  # noqa: E402

from agentcache.integrations.crewai import workflow  # noqa: E402

logging.getLogger("crewai.llms.base_llm").setLevel(logging.ERROR)  # "approximate token count" notes
MAX_DRAFTS = 3
tool_calls = 0  # check_facts calls, for the --json summary
_tool_calls_lock = threading.Lock()  # crews run in threads


@tool("check_facts")
def check_facts(claim: str) -> str:
    """Check a claim against the team's reference notes."""
    global tool_calls
    with _tool_calls_lock:
        tool_calls += 1
    time.sleep(random.Random(claim).uniform(0.05, 0.25))
    return "Supported by the reference notes."


class CallsTheFactChecker(BaseLLM):
    """The writer's model: sends each request to the real one; where tools are offered and the prompt does not
    end in a tool's result, the answer is replaced by a call of check_facts."""

    inner: Any

    def call(self, messages: Any, tools: Any = None, *args: Any, **kwargs: Any) -> Any:
        return self._script(messages, tools, self.inner.call(messages, tools, *args, **kwargs))

    async def acall(self, messages: Any, tools: Any = None, *args: Any, **kwargs: Any) -> Any:
        return self._script(messages, tools, await self.inner.acall(messages, tools, *args, **kwargs))

    def _script(self, messages: Any, tools: Any, answer: Any) -> Any:
        last = messages[-1] if isinstance(messages, list) and messages else {}
        if not tools or last.get("role") == "tool":
            return answer
        arguments = json.dumps({"claim": str(last.get("content", ""))[:80]})
        return [
            ChatCompletionMessageFunctionToolCall(
                id="call-1", type="function", function=Function(name="check_facts", arguments=arguments)
            )
        ]

    def supports_function_calling(self) -> bool:
        return True

    def get_context_window_size(self) -> int:
        return self.inner.get_context_window_size()


def one_task_crew(llm: Any, role: str, goal: str, backstory: str, description: str, tools: list | None = None) -> Crew:
    agent = Agent(
        role=role,
        goal=goal,
        backstory=backstory,
        llm=llm,
        tools=tools or [],
        max_iter=2 if tools else 1,
        max_retry_limit=0,
        allow_delegation=False,
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
        self._writer_llm = CallsTheFactChecker(model=llm.model, inner=llm)

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
            self._writer_llm,
            "Technical Writer",
            "Write a short, accurate post about {topic}.",
            "You are a senior technical writer who explains complex systems simply.",
            "Write a 150-word post about {topic}. Previous draft: {draft}. Feedback to address: {feedback}",
            tools=[check_facts],
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

        report(args, await run_workflows(args, solve, workflow, "self-eval"), tool_calls)
    shutil.rmtree(_HOME, ignore_errors=True)


if __name__ == "__main__":
    asyncio.run(main())
