"""An AutoGen selector group chat (planner, coder with a test tool, critic, summarizer), with agentcache's decorator.

    .venv/bin/python examples/autogen_group_chat.py --workflows 6 --json

Built the way AutoGen AgentChat's docs build a SelectorGroupChat; the only
agentcache line is the decorator on `solve`, whose integration reports each
tool call from AgentChat's events. Before every turn the selector asks the
model who speaks next (a prompt with no system message). The served model
has random weights, so the turn order is decided by seeded code: a
`candidate_func` offers the usual candidates, the real selector request is
sent, and its answer is replaced by the seeded choice. The critic approves or
sends the coder back (a seeded coin flip, at most three coder turns). The
coder has a `run_tests` tool; in each of its turns its model's answer is
scripted to call it (random weights never ask for a tool), the tool takes a
seeded fraction of a second, and the coder's next call reads its result.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Mapping, Sequence
from typing import Any

from _support import parse_args, report, run_workflows, server
from autogen_agentchat.agents import AssistantAgent
from autogen_agentchat.conditions import MaxMessageTermination, SourceMatchTermination
from autogen_agentchat.messages import BaseChatMessage
from autogen_agentchat.teams import SelectorGroupChat
from autogen_core import FunctionCall
from autogen_core.models import (
    ChatCompletionClient,
    CreateResult,
    FunctionExecutionResultMessage,
    ModelFamily,
    ModelInfo,
)
from autogen_core.tools import FunctionTool
from autogen_ext.models.openai import OpenAIChatCompletionClient

from agentcache.integrations.autogen import workflow

AGENTS = {
    "planner": (
        "Breaks the task into steps.",
        "You are the planner of a software team. Break the task into small steps. " * 5,
    ),
    "coder": (
        "Writes and fixes Python code.",
        "You are an expert Python developer. Write or fix the code for the plan. " * 5,
    ),
    "critic": ("Reviews the code.", "You are a strict code reviewer. Point out bugs and say APPROVE or REVISE. " * 5),
    "summarizer": ("Writes the final answer.", "You summarize the team's final solution in a few sentences. " * 5),
}
MAX_CODER_TURNS = 3
MODEL_INFO = ModelInfo(
    vision=False, function_calling=True, json_output=False, family=ModelFamily.UNKNOWN, structured_output=False
)
tool_calls = 0  # run_tests calls, for the --json summary


async def run_tests(seed: str) -> str:
    """Run the project's test suite and report which tests failed."""
    global tool_calls
    tool_calls += 1
    await asyncio.sleep(random.Random(seed).uniform(0.05, 0.25))
    return "3 passed, 1 failed: test_refills_after_window"


class SeededTurns:
    """planner -> coder -> critic -> (coder -> critic)* -> summarizer, the critic's verdict a seeded coin flip."""

    def __init__(self, seed: str):
        self.seed = seed
        self.next: str | None = None

    def candidates(self, thread: Sequence[Any]) -> list[str]:
        speakers = [m.source for m in thread if isinstance(m, BaseChatMessage) and m.source != "user"]
        last = speakers[-1] if speakers else None
        coder_turns = speakers.count("coder")
        if last is None:
            self.next = "planner"
        elif last == "planner":
            self.next = "coder"
        elif last == "coder":
            self.next = "critic"
        elif last == "critic":
            approved = random.Random(f"{self.seed}:{coder_turns}").random() < 0.5
            self.next = "summarizer" if approved or coder_turns >= MAX_CODER_TURNS else "coder"
        else:
            self.next = "summarizer"
        # The candidates SelectorGroupChat would offer itself (everyone but the last speaker),
        # so the selector's prompt is exactly the one an unscripted run would send.
        return [name for name in AGENTS if name != last]


class Scripted(ChatCompletionClient):
    """A model client that sends every request to the real one and may replace its answer (`script`)."""

    def __init__(self, inner: ChatCompletionClient):
        self._inner = inner

    async def create(self, messages: Sequence[Any], **kwargs: Any) -> CreateResult:
        return self.script(messages, kwargs, await self._inner.create(messages, **kwargs))

    def script(self, messages: Sequence[Any], kwargs: dict[str, Any], result: CreateResult) -> CreateResult:
        return result

    def create_stream(self, messages: Sequence[Any], **kwargs: Any) -> Any:
        raise NotImplementedError("the example's models do not stream")

    async def close(self) -> None:
        await self._inner.close()

    def actual_usage(self) -> Any:
        return self._inner.actual_usage()

    def total_usage(self) -> Any:
        return self._inner.total_usage()

    def count_tokens(self, messages: Sequence[Any], **kwargs: Any) -> int:
        return self._inner.count_tokens(messages, **kwargs)

    def remaining_tokens(self, messages: Sequence[Any], **kwargs: Any) -> int:
        return self._inner.remaining_tokens(messages, **kwargs)

    @property
    def capabilities(self) -> Mapping[str, Any]:
        return self._inner.capabilities

    @property
    def model_info(self) -> ModelInfo:
        return self._inner.model_info


class SeededSelector(Scripted):
    """Sends the real selector request, then answers with the seeded choice."""

    def __init__(self, inner: ChatCompletionClient, turns: SeededTurns):
        super().__init__(inner)
        self._turns = turns

    def script(self, messages: Sequence[Any], kwargs: dict[str, Any], result: CreateResult) -> CreateResult:
        return result.model_copy(update={"content": self._turns.next})


class CallsTheTests(Scripted):
    """The coder's model: where its prompt does not end in the tests' result, the answer calls run_tests."""

    def __init__(self, inner: ChatCompletionClient, seed: str):
        super().__init__(inner)
        self._seed, self._calls = seed, 0

    def script(self, messages: Sequence[Any], kwargs: dict[str, Any], result: CreateResult) -> CreateResult:
        if not kwargs.get("tools") or isinstance(messages[-1], FunctionExecutionResultMessage):
            return result
        self._calls += 1
        arguments = json.dumps({"seed": f"{self._seed}:{self._calls}"})
        call = FunctionCall(id=f"call-{self._calls}", name="run_tests", arguments=arguments)
        return result.model_copy(update={"content": [call], "finish_reason": "function_calls"})


async def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    with server(args) as base_url:
        client = OpenAIChatCompletionClient(
            model="default",
            base_url=base_url,
            api_key=args.api_key or "none",
            model_info=MODEL_INFO,
            max_tokens=8,
            temperature=0,
        )

        async def solve(i: int) -> None:
            turns = SeededTurns(f"{args.seed}:{i}")
            tests = FunctionTool(run_tests, description="Run the project's test suite.")
            coder = {"model_client": CallsTheTests(client, f"{args.seed}:{i}"), "tools": [tests]}
            coder["reflect_on_tool_use"] = True  # its next call reads the tests' result
            agents = [
                AssistantAgent(
                    name, description=d, system_message=s, **(coder if name == "coder" else {"model_client": client})
                )
                for name, (d, s) in AGENTS.items()
            ]
            team = SelectorGroupChat(
                agents,
                model_client=SeededSelector(client, turns),
                candidate_func=turns.candidates,
                termination_condition=SourceMatchTermination(["summarizer"])
                | MaxMessageTermination(2 * MAX_CODER_TURNS + 4),
            )
            await team.run(task=f"Task {i}: implement a rate limiter with tests.")

        per_workflow = await run_workflows(args, solve, workflow, "group-chat")
        await client.close()
        report(args, per_workflow, tool_calls)


if __name__ == "__main__":
    asyncio.run(main())
