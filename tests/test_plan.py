"""What an app's framework knows (issue 53): its plan, the agents it decided make a workflow's next call, and the
contexts it knows are done; how the policies hear them."""

from __future__ import annotations

import pytest

from agentcache.policy import WorkflowRegistry, make_policy
from agentcache.tags import WorkflowKey
from agentcache.trace import Plan

W1 = WorkflowKey("", "w1")


@pytest.mark.parametrize("name", ["lru", "lifecycle", "cachescout", "pbkv", "pbkv-paper", "lfu"])
def test_every_policy_hears_the_plan_next_and_agent_done_without_failing(name):
    policy = make_policy(name, registry=WorkflowRegistry())
    policy.on_plan("app", Plan(graph={"a": ("b",)}, order=("a", "b"), max_turns=4), 0.0)
    policy.on_next(W1, ("a",), 1.0)  # a workflow not active: nothing to do
    policy.on_agent_done(W1, "a", 2.0)
