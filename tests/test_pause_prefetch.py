"""With a host tier, a paused agent's path comes back to the device as its tool's predicted end nears (issue 52):
pbkv's prefetch values it by how soon the tool returns, not by the forecast alone."""

from __future__ import annotations

import pytest
from test_tool_pauses import Scene

from agentcache.replay.runner import hear_hint
from agentcache.tags import WorkflowKey
from agentcache.trace import ToolEnd

W1 = WorkflowKey("", "w1")


def coder_learned_a_ten_second_tool(scene: Scene) -> None:
    for _ in range(10):  # as its earlier calls of the tool would have taught it
        scene.policy.pauses.learn("coder", "run_tests", 10.0)


def paused_value(scene: Scene) -> float:
    end = scene.policy.latest[W1]["coder"].end
    return sum(c.value for c in scene.policy.prefetch_candidates() if c.node is end)


def test_a_paused_path_is_prefetched_by_how_soon_its_tool_returns():
    scene = Scene("pbkv")
    coder_learned_a_ten_second_tool(scene)
    scene.coder_calls_a_tool()  # at 1 s, run_tests
    scene.workers("w2", 2.0)
    scene.workers("w2", 4.0)  # a step of 2 s
    step_gap = scene.policy.timing.gaps.mean
    scene.policy.timing.now = 2.0  # 9 s of the tool left
    early = paused_value(scene)
    assert early == pytest.approx(0.8 ** (9.0 / step_gap))
    scene.policy.timing.now = 10.5  # half a second left
    assert paused_value(scene) == pytest.approx(0.8 ** (0.5 / step_gap))
    assert paused_value(scene) > early
    hear_hint(scene.policy, ToolEnd(11.0, "w1", "coder", "run_tests"), 11.0)
    assert paused_value(scene) == pytest.approx(1.0)  # back from its tool: its call is due now


def test_without_tool_events_the_forecast_alone_values_it():
    scene = Scene("pbkv/-tools")
    scene.coder_calls_a_tool()
    scene.workers("w2 w3", 2.0)
    assert paused_value(scene) == pytest.approx(0.5)  # the coder calls itself again with p = 0.5
