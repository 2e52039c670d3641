"""Agent state per node is bounded (issue 55, case 6): agent names are the client's, and a client naming a new
agent at every request must not grow what the scheduler keeps, or scans to score a node, without bound."""

from __future__ import annotations

from itertools import count

import pytest

from agentcache.policy import make_policy
from agentcache.policy.nodes import MAX_AGENTS_PER_WORKFLOW, MAX_FIXED_AGENTS_PER_NODE, tags_of
from agentcache.predictor import END, Predictor
from agentcache.tags import Tags

_clock = count(1)


class Node:
    """A radix node as a policy sees it."""

    def __init__(self, tokens: int):
        self.key = [0] * tokens
        self.hit_count = 0
        self.last_access_time = next(_clock)


def serve(policy, path, tags, now):  # noqa: ANN001, ANN201
    policy.on_request(tags, now)
    for node in path:
        node.last_access_time = next(_clock)
    policy.tag_path(path, tags, now, None)  # its prompt in the tree, as the server tags it first
    policy.tag_path(path, tags, now, 32)  # finished, its 32-token prefix read from cache
    policy.on_release(tags, now)


class Ends(Predictor):
    """Forecasts every workflow's end: the forecaster's own cost is not what this measures (its agents are capped
    on their own, predictor/markov.py)."""

    def predict(self, path, hidden=None):  # noqa: ANN001, ANN201
        return [{END: 1.0}] * self.horizon


@pytest.mark.parametrize("name", ["pbkv", "lifecycle"])
def test_a_new_agent_name_per_request_leaves_bounded_state_on_the_shared_node(name):
    """Before, 20,000 requests of one workflow sharing a 32-token prefix, each under a new agent_name, left
    20,000 entries in the prefix node's fixed agents, in its workflow's agent set and in the policy's latest
    paths: scoring that node took 1.28 ms and grew linearly, on the scheduler thread. Now each is capped, the
    least recently tagged agents going first; the agents of the last requests are remembered."""
    policy = make_policy(name, predictor=Ends())
    prefix = Node(32)
    suffixes = [Node(8) for _ in range(16)]  # a cache holds a few of the requests' own suffixes
    n = 20_000
    for i in range(n):
        tags = Tags(workflow="w", agent="fp", agent_name=f"agent-{i}", fixed_tokens=32)
        serve(policy, [prefix, suffixes[i % len(suffixes)]], tags, now=i * 0.01)
        if i % 1000 == 0:
            policy.priority(prefix)
    t = tags_of(prefix)
    (agents,) = t.workflows.values()
    assert len(agents) <= MAX_AGENTS_PER_WORKFLOW and f"agent-{n - 1}" in agents
    assert len(t.fixed_agents) <= MAX_FIXED_AGENTS_PER_NODE and f"agent-{n - 1}" in t.fixed_agents
    (latest,) = policy.latest.values()
    assert len(latest) <= MAX_AGENTS_PER_WORKFLOW and f"agent-{n - 1}" in latest
    policy.priority(prefix)  # still keyed: what it reads is bounded by the sizes above


def test_the_caps_leave_a_handful_of_agents_per_workflow_alone():
    """The traces have at most 6 agents per workflow and 1 per fixed prompt: nothing of theirs is ever forgotten,
    so their hit rates do not change."""
    policy = make_policy("pbkv")
    prefix = Node(32)
    for step in range(60):
        agent = f"agent-{step % MAX_AGENTS_PER_WORKFLOW}"
        serve(policy, [prefix, Node(8)], Tags(workflow="w", agent=agent, fixed_tokens=32), now=step * 0.01)
    expected = {f"agent-{i}" for i in range(MAX_AGENTS_PER_WORKFLOW)}
    assert set(tags_of(prefix).workflows[policy.latest.popitem()[0]]) == expected
    assert tags_of(prefix).fixed_agents == expected
