"""Each of pbkv's ingredients switched off, alone, changes the eviction decision it exists for.

Every test builds the same small scene twice, with pbkv's own ingredients and with one of them off, and
asserts the two orders it derives: a switch that did nothing would fail it.
"""

from __future__ import annotations

from dataclasses import fields, replace

from test_policies import FixedForecast, Node, _clock, eviction_order, touch

from agentcache.policy.pbkv import Ingredients, PBKVPolicy
from agentcache.predictor import END
from agentcache.tags import Tags, WorkflowKey

OURS = Ingredients()


def without(name: str) -> Ingredients:
    off = replace(OURS, **{name: False})
    assert off != OURS, f"{name} is on in pbkv's own ingredients"
    return off


def test_lifecycle_off_ranks_an_ended_workflows_cache_with_the_rest():
    """With the lifecycle tier, cache that only ended workflows touched goes before anything an active workflow
    touched, however recent; without it, by the same score as the rest (here: recency)."""

    def order(ingredients: Ingredients) -> list[str]:
        policy = PBKVPolicy(predictor=FixedForecast({}), ingredients=ingredients)
        active, ended = Node("active"), Node("ended")
        touch(policy, [active], "w1", "x", 0)  # w1 goes on, forecast to read nothing more
        touch(policy, [ended], "w2", "x", 1)
        policy.on_end(WorkflowKey("", "w2"), 2)
        return eviction_order(policy, [active, ended])

    assert order(OURS) == ["ended", "active"]
    assert order(without("lifecycle")) == ["active", "ended"]


def test_current_paths_off_values_a_path_the_pair_has_left():
    """A (workflow, agent) whose history went another way (rewritten, truncated) no longer reads its old path:
    with `current_paths` that path is worth nothing to the pair; without it, the pair's forecast still values it
    above a newer node nobody will read."""
    forecast = {"coder": [{"coder": 1.0}, {END: 1.0}]}  # the coder calls itself again

    def order(ingredients: Ingredients) -> list[str]:
        policy = PBKVPolicy(predictor=FixedForecast(forecast), ingredients=ingredients)
        left, taken, idle = Node("left"), Node("taken"), Node("idle")
        touch(policy, [left], "w1", "coder", 0)
        touch(policy, [taken], "w1", "coder", 1)  # the pair's next request went another way
        touch(policy, [idle], "w2", "tester", 2)  # forecast to read nothing more
        return eviction_order(policy, [left, idle])

    assert order(OURS) == ["left", "idle"]
    assert order(without("current_paths")) == ["idle", "left"]


def test_reuse_off_values_a_pairs_latest_path_as_if_read_whole():
    """A node on a pair's latest path is worth the share of that part of the path the agent's next request
    reads again (learned; half, before any evidence): with `reuse`, the coder's fresh tokens (worth 1.0 x 1/2)
    go before the reviewer's fixed prompt (demand 0.7); without it the fresh tokens count whole, and stay."""
    forecast = {"coder": [{"coder": 1.0}, {END: 1.0}], "reviewer": [{"reviewer": 0.7, END: 0.3}, {END: 1.0}]}

    def order(ingredients: Ingredients) -> list[str]:
        policy = PBKVPolicy(predictor=FixedForecast(forecast), ingredients=ingredients)
        fresh, prompt = Node("fresh"), Node("reviewer_prompt")
        touch(policy, [fresh], "w1", "coder", 0)
        touch(policy, [prompt], "w2", "reviewer", 1, fixed_tokens=10)
        return eviction_order(policy, [fresh, prompt])

    assert order(OURS) == ["fresh", "reviewer_prompt"]
    assert order(without("reuse")) == ["reviewer_prompt", "fresh"]


def test_retired_evidence_off_orders_ended_cache_by_recency_alone():
    """In the retired tier, `retired_evidence` evicts generated output no prompt re-sent yet before prompts
    (a later turn that re-sends it reads the prompt above it too); without it, the older goes first."""

    def order(ingredients: Ingredients) -> list[str]:
        policy = PBKVPolicy(predictor=FixedForecast({}), ingredients=ingredients)
        prompt, answer = Node("prompt"), Node("answer")
        tags = Tags(workflow="turn", agent="assistant")
        policy.on_request(tags, 0)
        for node in (prompt, answer):
            node.last_access_time = next(_clock)
        policy.tag_path([prompt, answer], tags, 0, 0, prompt_tokens=10)  # the answer is generated output
        policy.on_end(WorkflowKey("", "turn"), 1)
        return eviction_order(policy, [prompt, answer])

    assert order(OURS) == ["answer", "prompt"]
    assert order(without("retired_evidence")) == ["prompt", "answer"]


def test_retired_ages_off_orders_ended_cache_by_recency_alone():
    """Where retired nodes that outlived the cache's turnover were read again for certain and young ones
    mostly evicted unread, `retired_ages` keeps the old node over the young one; without it, LRU."""

    def order(ingredients: Ingredients) -> list[str]:
        policy = PBKVPolicy(predictor=FixedForecast({}), ingredients=ingredients)
        for _ in range(4):  # read again at 10 s of age, evicted unread at 2 s
            policy.retired_ages.read(["assistant"], 10.0, 100)
            policy.retired_ages.evicted(["assistant"], 2.0, 400)
        old, young = Node("old"), Node("young")
        touch(policy, [old], "turn-1", "assistant", 0.0)
        policy.on_end(WorkflowKey("", "turn-1"), 0.0)
        touch(policy, [young], "turn-2", "assistant", 4.5)
        policy.on_end(WorkflowKey("", "turn-2"), 4.5)
        policy.retired_ages.freeze()
        touch(policy, [Node("other")], "turn-3", "other", 5.0)  # the clock moves on: ages 5 s and 0.5 s
        return eviction_order(policy, [old, young])

    assert order(OURS) == ["young", "old"]
    assert order(without("retired_ages")) == ["old", "young"]


def test_fixed_by_forecast_off_lets_a_fixed_prompt_only_ended_workflows_read_go_first():
    """An agent's fixed prompt is worth every active workflow's forecast of calling it, touched or not; without
    `fixed_by_forecast`, the tester's prompt, read so far only by an ended workflow, is retired cache."""
    forecast = {"planner": [{"tester": 1.0}, {END: 1.0}]}

    def order(ingredients: Ingredients) -> list[str]:
        policy = PBKVPolicy(predictor=FixedForecast(forecast), ingredients=ingredients)
        prompt, idle = Node("tester_prompt"), Node("idle")
        touch(policy, [prompt], "old", "tester", 0, fixed_tokens=10)
        policy.on_end(WorkflowKey("", "old"), 1)
        touch(policy, [Node("plan")], "w1", "planner", 2, fixed_tokens=10)  # w1 calls the tester next
        touch(policy, [idle], "w2", "x", 3)  # forecast to read nothing more
        return eviction_order(policy, [prompt, idle])

    assert order(OURS) == ["idle", "tester_prompt"]
    assert order(without("fixed_by_forecast")) == ["tester_prompt", "idle"]


def test_arrivals_off_values_no_call_of_a_workflow_not_started_yet():
    """Workflows keep arriving, and each starts at the planner: with `arrivals` the planner's fixed prompt is
    worth those calls though no workflow is open; without, nothing values it, and it goes by recency."""
    forecast = {None: [{"planner": 1.0}, {END: 1.0}]}  # a new workflow's first agent: the planner

    def order(ingredients: Ingredients) -> list[str]:
        policy = PBKVPolicy(predictor=FixedForecast(forecast), ingredients=ingredients)
        prompt, idle = Node("planner_prompt"), Node("idle")
        for i in range(20):  # learn the gaps (1 s) and the arrival rate (one workflow every 2 s)
            touch(policy, [prompt], f"w{i}", "planner", 2 * i, fixed_tokens=10)
            touch(policy, [Node(f"work{i}")], f"w{i}", "x", 2 * i + 1)
            policy.on_end(WorkflowKey("", f"w{i}"), 2 * i + 1.5)
        touch(policy, [idle], "last", "x", 40)
        return eviction_order(policy, [prompt, idle])

    assert order(OURS) == ["idle", "planner_prompt"]
    assert order(without("arrivals")) == ["planner_prompt", "idle"]


def test_timing_off_values_a_stalled_workflow_as_much_as_a_busy_one():
    """A workflow idle far longer than any gap seen is discounted by `timing` (gamma^(residual / mean gap)):
    its history goes before a busy workflow's, though its forecast values it more; without, the forecast
    alone decides."""
    forecast = {"coder": [{"coder": 1.0}, {END: 1.0}], "reviewer": [{"reviewer": 0.5, END: 0.5}, {END: 1.0}]}

    def order(ingredients: Ingredients) -> list[str]:
        policy = PBKVPolicy(predictor=FixedForecast(forecast), ingredients=ingredients)
        stalled, busy = Node("stalled"), Node("busy")
        for i in range(8):  # gaps of 1 s
            touch(policy, [Node(f"a{i}")], f"w{i}", "x", 3 * i)
            touch(policy, [Node(f"b{i}")], f"w{i}", "x", 3 * i + 1)
            policy.on_end(WorkflowKey("", f"w{i}"), 3 * i + 1.5)
        touch(policy, [stalled], "slow", "coder", 30)
        for t in range(31, 51):  # a refresh on the way weighs the stalled workflow again
            touch(policy, [busy], "fast", "reviewer", t)
        return eviction_order(policy, [stalled, busy])

    assert order(OURS) == ["stalled", "busy"]
    assert order(without("timing")) == ["busy", "stalled"]


def test_evidence_off_ignores_how_often_a_node_was_read():
    """`evidence` scales a value by (hits + 1) / (hits + 2): a prompt already read from cache outranks one a
    little likelier to be called but never read; without, the forecast alone decides."""
    forecast = {"planner": [{"coder": 0.35, "tester": 0.4, END: 0.25}, {END: 1.0}]}

    def order(ingredients: Ingredients) -> list[str]:
        policy = PBKVPolicy(predictor=FixedForecast(forecast), ingredients=ingredients)
        read, unread = Node("coder_prompt"), Node("tester_prompt")
        touch(policy, [read], "w0", "coder", 0, fixed_tokens=10, matched=10)  # found in cache: a hit
        touch(policy, [unread], "w1", "tester", 1, fixed_tokens=10)
        touch(policy, [Node("plan")], "w2", "planner", 2, fixed_tokens=10)
        return eviction_order(policy, [read, unread])

    assert order(OURS) == ["tester_prompt", "coder_prompt"]
    assert order(without("evidence")) == ["coder_prompt", "tester_prompt"]


def test_cost_on_keeps_the_deeper_of_two_prompts_worth_the_same():
    """`cost` (off in pbkv's own) weighs a value by what a miss costs per token held, which grows with the
    node's depth (attention over its context): of two prompts the forecast values alike, the shallower goes
    first; without it, the older."""
    forecast = {"planner": [{"coder": 0.4, "tester": 0.4, END: 0.2}, {END: 1.0}]}

    def order(ingredients: Ingredients) -> list[str]:
        policy = PBKVPolicy(predictor=FixedForecast(forecast), ingredients=ingredients)
        deep, shallow = Node("deep"), Node("shallow")
        touch(policy, [Node("preamble"), deep], "w0", "coder", 0, fixed_tokens=20)
        touch(policy, [shallow], "w1", "tester", 1, fixed_tokens=10)
        touch(policy, [Node("plan")], "w2", "planner", 2, fixed_tokens=10)
        return eviction_order(policy, [deep, shallow])

    assert not OURS.cost
    assert order(OURS) == ["deep", "shallow"]
    assert order(replace(OURS, cost=True)) == ["shallow", "deep"]


def test_fallback_off_orders_unvalued_nodes_by_recency_alone():
    """Nodes no forecast values go by their read rate with `fallback`: a node read twice outranks a newer
    one never read; without it, LRU."""

    def order(ingredients: Ingredients) -> list[str]:
        policy = PBKVPolicy(predictor=FixedForecast({}), ingredients=ingredients)
        popular, fresh = Node("popular"), Node("fresh")
        touch(policy, [popular], "w1", "x", 0, matched=10)
        touch(policy, [popular], "w1", "x", 1, matched=10)
        touch(policy, [fresh], "w2", "x", 2)
        return eviction_order(policy, [popular, fresh])

    assert order(OURS) == ["fresh", "popular"]
    assert order(without("fallback")) == ["popular", "fresh"]


def test_pending_off_counts_no_read_for_a_request_waiting_to_be_served():
    """A request waiting at an eviction round reads its agent's fixed prompt for certain: with `pending` that
    prompt outranks a newer node nobody will read; without, nothing values it."""

    def order(ingredients: Ingredients) -> list[str]:
        policy = PBKVPolicy(predictor=FixedForecast({}), ingredients=ingredients)
        prompt, idle = Node("coder_prompt"), Node("idle")
        touch(policy, [prompt], "w1", "coder", 0, fixed_tokens=10)
        touch(policy, [idle], "w2", "x", 1)
        policy.on_request(Tags(workflow="w1", agent="coder", fixed_tokens=10), 2)  # queued, not admitted
        policy.take_changed_keys()  # an eviction round while it waits
        return eviction_order(policy, [prompt, idle])

    assert order(OURS) == ["idle", "coder_prompt"]
    assert order(without("pending")) == ["coder_prompt", "idle"]


def test_tools_off_values_a_path_waiting_on_a_tool_by_the_forecast_alone():
    """An agent waiting on a tool calls next for certain: with `tools` its path outranks a workflow its
    forecast favours; without, the forecast alone (the coder may stop there) ranks it below."""
    forecast = {"coder": [{"coder": 0.5, END: 0.5}], "worker": [{"worker": 0.9, END: 0.1}]}

    def order(ingredients: Ingredients) -> list[str]:
        policy = PBKVPolicy(predictor=FixedForecast(forecast, horizon=1), ingredients=ingredients)
        paused, busy = Node("paused"), Node("busy")
        touch(policy, [paused], "w1", "coder", 0)
        policy.on_tool_start(WorkflowKey("", "w1"), "coder", "run_tests", 1)
        touch(policy, [busy], "w2", "worker", 2)
        return eviction_order(policy, [paused, busy])

    assert order(OURS) == ["busy", "paused"]
    assert order(without("tools")) == ["paused", "busy"]


def test_plan_off_values_a_path_by_the_forecast_alone_when_the_framework_named_its_agent_next():
    """The framework decided the coder calls next: with `plan` its path outranks a workflow its forecast favours;
    without, the forecast alone (the coder may stop there) ranks it below."""
    forecast = {"coder": [{"coder": 0.3, END: 0.7}], "worker": [{"worker": 0.9, END: 0.1}]}

    def order(ingredients: Ingredients) -> list[str]:
        policy = PBKVPolicy(predictor=FixedForecast(forecast, horizon=1), ingredients=ingredients)
        told, busy = Node("told"), Node("busy")
        touch(policy, [told], "w1", "coder", 0)
        touch(policy, [busy], "w2", "worker", 1)
        policy.on_next(WorkflowKey("", "w1"), ("coder",), 2)
        return eviction_order(policy, [told, busy])

    assert order(OURS) == ["busy", "told"]
    assert order(without("plan")) == ["told", "busy"]


def test_every_ingredient_has_a_test_here():
    tested = {"lifecycle", "current_paths", "reuse", "retired_evidence", "retired_ages", "fixed_by_forecast"}
    tested |= {"arrivals", "timing", "evidence", "cost", "fallback", "pending", "tools", "plan"}
    assert tested == {f.name for f in fields(Ingredients)}
