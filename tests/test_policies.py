"""Each policy's eviction order on small hand-built trees, derived from its formula.

The policy core is engine-agnostic, so these trees are plain objects with the
three attributes a policy reads from an engine node; test_replay.py checks the
same policies inside SGLang's real cache.
"""

from __future__ import annotations

import math
from dataclasses import replace
from itertools import count

import pytest

from agentcache.policy import AgentStepGraph, NodeClass, WorkflowRegistry, make_policy, tags_of
from agentcache.policy.pbkv import PAPER, Ingredients, PBKVPolicy, RetiredAges
from agentcache.predictor import END, Predictor
from agentcache.tags import Tags, WorkflowKey

_clock = count(1)


class Node:
    """A radix node as a policy sees it."""

    def __init__(self, name: str, tokens: int = 10):
        self.name = name
        self.key = [0] * tokens
        self.hit_count = 0
        self.last_access_time = next(_clock)

    def __repr__(self) -> str:
        return self.name


def touch(policy, path, workflow, agent, now, fixed_tokens=0, matched=0):
    tags = Tags(workflow=workflow, agent=agent, fixed_tokens=fixed_tokens)
    policy.on_request(tags, now)
    for node in path:
        node.last_access_time = next(_clock)
    policy.tag_path(path, tags, now, matched)
    policy.on_release(tags, now)  # finished


def eviction_order(policy, nodes):
    return [n.name for n in sorted(nodes, key=policy.priority)]


class FixedForecast(Predictor):
    """A predictor whose forecast for a workflow is set by the test (by the workflow's current agent)."""

    def __init__(self, by_agent, horizon=2):
        super().__init__(horizon)
        self.by_agent = by_agent

    def predict(self, path, hidden=None):
        return self.by_agent.get(path[-1] if path else None, [{END: 1.0}] * self.horizon)


def test_lru_is_recency():
    policy = make_policy("lru")
    a, b, c = Node("a"), Node("b"), Node("c")
    touch(policy, [b], "w1", "x", 0)
    touch(policy, [a], "w2", "x", 1)
    touch(policy, [c], "w3", "x", 2)
    assert eviction_order(policy, [a, b, c]) == ["b", "a", "c"]


def test_lifecycle_evicts_nodes_only_ended_workflows_used_first():
    policy = make_policy("lifecycle")
    old_active, shared, ended_new = Node("old_active"), Node("shared"), Node("ended_new")
    touch(policy, [old_active], "w1", "x", 0)
    touch(policy, [shared], "w2", "x", 1)
    touch(policy, [shared, ended_new], "w3", "x", 2)
    policy.on_end(WorkflowKey("", "w3"), 3)
    assert policy.classify(ended_new) == NodeClass.RETIRED
    assert policy.classify(shared) != NodeClass.RETIRED  # w2 still active
    assert eviction_order(policy, [old_active, shared, ended_new]) == ["ended_new", "old_active", "shared"]
    assert not policy.on_end(WorkflowKey("", "w3"), 4)  # a second end is a no-op


def test_kvflow_steps_to_execution_or_and_and():
    graph = AgentStepGraph({"a": ["b", "c"], "b": ["d"], "c": ["d"], "d": ["a"]})
    steps = graph.steps_from("a")
    assert steps["b"] == 1 and steps["c"] == 1 and steps["d"] == 2 and steps["a"] == 3
    join = AgentStepGraph({"a": ["b"], "b": ["c", "d"], "c": ["d"]}, and_joins=["d"])
    s = join.steps_from("a")
    assert s["c"] == 2 and s["d"] == 3  # AND: max(E(b), E(c)) + 1, OR would give 2
    assert math.isinf(join.steps_from("d")["a"])


def test_kvflow_orders_fixed_prompts_by_steps_and_dynamic_first():
    policy = make_policy("kvflow", call_graph={"a": ["b"], "b": ["c"], "c": ["a"]})
    sys_a, sys_b, sys_c, hist = Node("sys_a"), Node("sys_b"), Node("sys_c"), Node("hist")
    touch(policy, [sys_b], "w0", "b", 0, fixed_tokens=10)
    touch(policy, [sys_c], "w0", "c", 1, fixed_tokens=10)
    touch(policy, [sys_a, hist], "w0", "a", 2, fixed_tokens=10)
    # w0 is at a: E(b)=1, E(c)=2, E(a)=3; the dynamic suffix goes first
    assert eviction_order(policy, [sys_a, sys_b, sys_c, hist]) == ["hist", "sys_a", "sys_c", "sys_b"]
    # a second workflow at b: E(c) = min(2, 1) = 1 and E(a) = min(3, 2) = 2 (min over workflows);
    # sys_b and sys_c tie at 1, and LRU breaks the tie
    touch(policy, [Node("x")], "w1", "b", 3)
    assert eviction_order(policy, [sys_a, sys_b, sys_c]) == ["sys_a", "sys_b", "sys_c"]


def test_cachescout_is_lru_when_unpredictable_and_survival_when_predictable():
    policy = make_policy("cachescout")
    nodes = {a: Node(f"sys_{a}") for a in "abc"}
    # First requests: no transition seen yet, predictability 0 -> recency decides.
    touch(policy, [nodes["a"]], "w", "a", 0, fixed_tokens=10)
    touch(policy, [nodes["b"]], "w", "b", 1, fixed_tokens=10)
    assert policy.predictability() == 1.0  # one transition seen, fully predictable
    # Learn a -> b -> c -> a deterministically over many workflows.
    t = 2
    for i in range(20):
        for a in "abc":
            touch(policy, [nodes[a]], f"v{i}", a, t, fixed_tokens=10)
            t += 1
        policy.on_end(WorkflowKey("", f"v{i}"), t)
    policy.on_end(WorkflowKey("", "w"), t)
    touch(policy, [nodes["a"]], "live", "a", t + 1, fixed_tokens=10)
    # live workflow at a: b is 1 hop (p = 3/4), c 2 hops (1/2), a 3 hops (1/4)
    assert eviction_order(policy, list(nodes.values())) == ["sys_a", "sys_c", "sys_b"]


def test_pbkv_paper_score_is_the_formula():
    forecast = {
        "a": [{"b": 0.6, "c": 0.3, END: 0.1}, {"c": 0.5, "b": 0.2, END: 0.3}],
        "b": [{"c": 1.0}, {END: 1.0}],
    }
    gamma = 0.5
    policy = PBKVPolicy(predictor=FixedForecast(forecast), gamma=gamma, ingredients=PAPER)
    hb, hc, shared, retired = Node("hist_b"), Node("hist_c"), Node("shared"), Node("retired")
    touch(policy, [retired], "gone", "b", 0)
    policy.on_end(WorkflowKey("", "gone"), 0.5)
    touch(policy, [shared, hb], "w1", "b", 1)  # w1 read hb as agent b
    touch(policy, [shared, hc], "w2", "c", 2)  # w2 read hc as agent c
    touch(policy, [Node("x")], "w1", "a", 3)  # w1 moves on to agent a
    touch(policy, [Node("y")], "w2", "b", 4)  # w2 moves on to agent b
    # v_w1 from a: b = 0.6 + 0.5*0.2 = 0.7, c = 0.3 + 0.5*0.5 = 0.55; v_w2 from b: c = 1.0
    assert policy.ranking.score(hb) == pytest.approx(0.7)
    assert policy.ranking.score(hc) == pytest.approx(1.0)
    assert policy.ranking.score(shared) == pytest.approx(0.7 + 1.0)  # summed over workflows (w1 as b, w2 as c)
    assert eviction_order(policy, [shared, hc, hb, retired]) == ["retired", "hist_b", "hist_c", "shared"]


def test_pbkv_values_a_fixed_prompt_node_that_another_agent_reads_past_its_own_fixed_prompt():
    # `shared` is all of a's fixed prompt; b, whose fixed prompt is shorter, reads the same tokens as context.
    forecast = {"a": [{END: 1.0}, {END: 1.0}], "b": [{"b": 1.0}, {END: 1.0}]}
    policy = PBKVPolicy(
        predictor=FixedForecast(forecast), gamma=0.5, ingredients=replace(PAPER, fixed_by_forecast=True)
    )
    shared, tail = Node("shared"), Node("tail")
    touch(policy, [shared], "w1", "a", 0, fixed_tokens=10)
    assert policy.ranking.score(shared) == 0.0  # a's demand: w1 ends after a
    touch(policy, [shared, tail], "w2", "b", 1)
    # b's workflow reads it again next step, past b's fixed prompt
    assert policy.ranking.score(shared) == pytest.approx(1.0)


def test_pbkv_rekeys_a_workflows_history_when_it_moves_on_not_the_fixed_prompts_it_read():
    """A fixed prompt's key reads its agents' demand alone (every workflow shares it): a workflow moving on
    re-keys its own history, not the fixed prompts it read, unless their demand moved."""
    forecast = {"coder": [{"coder": 0.5, END: 0.5}, {END: 1.0}]}
    steady = Ingredients(timing=False, pending=False, arrivals=False)  # the coder's demand stays as it is
    policy = PBKVPolicy(predictor=FixedForecast(forecast), ingredients=steady)
    system, history = Node("system"), Node("history")
    touch(policy, [system, history], "w", "coder", 0.0, fixed_tokens=10)
    demand = dict(policy.demand.demand)
    policy.priority(system), policy.priority(history)  # the engine's heap keyed both
    policy.take_changed_keys()
    policy.on_request(Tags(workflow="w", agent="coder", fixed_tokens=10), 1.0)
    assert policy.demand.demand == demand
    assert tags_of(history).kept.epoch != policy.keys.epoch, "the history's key is recomputed at its next use"
    assert tags_of(system).kept.epoch == policy.keys.epoch
    assert not any(t is tags_of(system) for t in policy.take_changed_keys())


def test_pbkv_reports_a_history_key_to_the_heap_only_where_its_value_may_have_fallen():
    """A workflow moving on changes its nodes' values. Where every agent's term (weight x forecast value, and
    the agent it has waiting) stayed or grew, its nodes' keys can only have risen: they are recomputed at
    their next use, and the engine's heap, whose entry for them is then too low, finds that out when it
    reaches its top. Where a term its node reads fell, the heap must re-key the node at once."""
    forecast = {
        "coder": [{"coder": 0.5, END: 0.5}, {END: 1.0}],
        "tester": [{"coder": 0.9, END: 0.1}, {END: 1.0}],  # after the tester the coder is likelier
        "planner": [{END: 1.0}, {END: 1.0}],  # after the planner nobody calls the coder
    }
    policy = PBKVPolicy(
        predictor=FixedForecast(forecast), ingredients=Ingredients(timing=False, pending=False, arrivals=False)
    )
    history = Node("history")
    touch(policy, [history], "w", "coder", 0.0)
    policy.priority(history)  # the engine's heap keyed it
    policy.take_changed_keys()
    before = policy.priority(history)
    policy.on_request(Tags(workflow="w", agent="tester"), 1.0)  # the coder's term grew
    assert tags_of(history).kept.epoch != policy.keys.epoch
    assert not any(t is tags_of(history) for t in policy.take_changed_keys())
    risen = policy.priority(history)
    assert risen > before
    policy.on_request(Tags(workflow="w", agent="planner"), 2.0)  # the coder's term fell
    assert any(t is tags_of(history) for t in policy.take_changed_keys())
    assert policy.priority(history) < risen


def test_pbkv_counts_a_request_waiting_at_an_eviction_round_and_nothing_for_one_admitted_before():
    """A request waiting to be admitted reads its agent's fixed prompt for certain (`pending`): an eviction
    round while it waits keys the prompt higher, and its admission lowers it again. Most requests are
    admitted before any eviction round: those change no key, so the engine's heap has nothing to re-key."""
    forecast = {"coder": [{"coder": 0.5, END: 0.5}, {END: 1.0}]}
    policy = PBKVPolicy(predictor=FixedForecast(forecast), ingredients=Ingredients(timing=False, arrivals=False))
    system, history = Node("system"), Node("history")
    touch(policy, [system, history], "w", "coder", 0.0, fixed_tokens=10)
    settled = policy.priority(system)
    policy.priority(history)
    policy.take_changed_keys()
    request = Tags(workflow="w", agent="coder", fixed_tokens=10)

    policy.on_request(request, 1.0)
    policy.on_admit(request)  # admitted before any eviction round
    assert not any(t is tags_of(system) for t in policy.take_changed_keys())
    assert policy.priority(system) == settled

    policy.on_request(request, 2.0)
    policy.take_changed_keys()  # an eviction round while it waits
    assert policy.priority(system)[1] > settled[1]  # a key that rose: the heap finds it when it reaches the top
    policy.on_admit(request)
    assert any(t is tags_of(system) for t in policy.take_changed_keys())  # one that fell is reported
    assert policy.priority(system) == settled


def test_pbkv_evicts_ended_workflows_output_no_prompt_resent_before_their_prompts():
    policy = make_policy("pbkv")
    prompt1, out1, prompt2, out2 = Node("prompt1"), Node("out1"), Node("prompt2"), Node("out2")
    for workflow, path, now in (("w1", [prompt1, out1], 0), ("w2", [prompt2, out2], 1)):
        tags = Tags(workflow=workflow, agent="assistant")
        policy.on_request(tags, now)
        for node in path:
            node.last_access_time = next(_clock)
        policy.tag_path(path, tags, now, 0, prompt_tokens=10)  # the second node is the answer
        policy.on_end(WorkflowKey("", workflow), now + 0.5)
    # Retired either way; the answers first (oldest first), as SGLang's priority policy would, then the prompts.
    assert eviction_order(policy, [prompt1, out1, prompt2, out2]) == ["out1", "out2", "prompt1", "prompt2"]
    # The conversation goes on: its next turn re-sends the answer, which is prompt from then on.
    touch(policy, [prompt1, out1], "w3", "assistant", 2, matched=20)
    policy.on_end(WorkflowKey("", "w3"), 2.5)
    assert eviction_order(policy, [prompt1, out1, prompt2, out2]) == ["out2", "prompt2", "prompt1", "out1"]


def test_pbkv_values_fixed_prompts_by_every_active_workflow():
    forecast = {"planner": [{"coder": 1.0}, {"tester": 1.0}], "coder": [{"tester": 1.0}, {END: 1.0}]}
    only_fixed = Ingredients(arrivals=False, timing=False, evidence=False, fallback=False)
    paper = PBKVPolicy(predictor=FixedForecast(forecast), gamma=0.5, ingredients=PAPER)
    ours = PBKVPolicy(predictor=FixedForecast(forecast), gamma=0.5, ingredients=only_fixed)
    for policy in (paper, ours):
        sys_tester = Node("sys_tester")
        touch(policy, [sys_tester], "old", "tester", 0, fixed_tokens=10)
        policy.on_end(WorkflowKey("", "old"), 1)
        for i in range(3):  # three workflows at the planner, none has called the tester yet
            touch(policy, [Node(f"p{i}")], f"w{i}", "planner", 2 + i, fixed_tokens=10)
        policy.sys_tester = sys_tester
    assert paper.ranking.score(paper.sys_tester) == 0.0  # no active workflow touched it
    assert paper.priority(paper.sys_tester)[0] == 0  # ... so it is "retired"
    assert ours.ranking.score(ours.sys_tester) == pytest.approx(3 * 0.5)  # each: tester at step 2, gamma^1


def test_pbkv_arrivals_keep_the_entry_agents_prompt():
    policy = make_policy("pbkv")
    sys_planner = Node("sys_planner")
    t = 0.0
    for i in range(30):  # workflows start every 2 s; each calls planner then coder, 1 s apart
        touch(policy, [sys_planner], f"w{i}", "planner", t, fixed_tokens=10)
        touch(policy, [Node(f"c{i}")], f"w{i}", "coder", t + 1.0, fixed_tokens=10)
        policy.on_end(WorkflowKey("", f"w{i}"), t + 1.5)
        t += 2.0
    # no active workflow will call the planner again, but new workflows will
    assert policy.ranking.score(sys_planner) > 0.3


def test_pbkv_arrivals_fall_once_workflows_stop_starting():
    """A burst of workflows, then none: the time since the last one started counts as a gap at least that long,
    so the entry agent's prompt is no longer kept for workflows that do not come (a benchmark's fixed set of
    workflows; a batch job's end)."""
    policy = make_policy("pbkv")
    sys_planner = Node("sys_planner")
    for i in range(30):  # workflows start every 2 s
        touch(policy, [sys_planner], f"w{i}", "planner", 2.0 * i, fixed_tokens=10)
        policy.on_end(WorkflowKey("", f"w{i}"), 2.0 * i + 1.0)
    t = 60.0
    for step in range(300):  # then one long workflow works on, a step every 2 s, and no other starts
        touch(policy, [Node(f"c{step}")], "long", "coder", t, fixed_tokens=10)
        t += 2.0
    assert policy.ranking.score(sys_planner) < 0.05


def test_pbkv_ranks_a_turn_that_forecasts_its_end_with_retired_cache_when_later_turns_read_that():
    """Plain chat: each turn is a workflow of its own, the next turn reads what the ended one wrote. The turn
    just served forecasts END for itself; its nodes must not outrank retired history that later turns read,
    and its unread answer goes first. Where no later workflow reads retired cache, nothing moves."""

    def serve(policy, path, workflow, agent, now, matched, prompt_nodes, checkpoint=False):
        tags = Tags(workflow=workflow, agent=agent, fixed_tokens=10)
        policy.on_request(tags, now)
        for node in path:
            node.last_access_time = next(_clock)
        if checkpoint:  # as the server does: the prompt tagged once computed, the whole path at the finish
            policy.tag_path(path[:prompt_nodes], tags, now, None)
        policy.tag_path(path, tags, now, 10 * matched, 10 * prompt_nodes)

    def chat(spec, checkpoint=False):
        policy = make_policy(spec)
        sys_prompt = Node("sys")
        t = 0.0
        for i in range(40):  # two turns per conversation; turn 2 re-sends turn 1's question and answer
            question, answer = Node(f"q{i}"), Node(f"a{i}")
            serve(policy, [sys_prompt, question, answer], f"c{i}-1", "assistant", t, 1 if i else 0, 2, checkpoint)
            policy.on_end(WorkflowKey("", f"c{i}-1"), t + 1)
            follow_up, answer2 = Node(f"q{i}b"), Node(f"a{i}b")
            path = [sys_prompt, question, answer, follow_up, answer2]
            serve(policy, path, f"c{i}-2", "assistant", t + 5, 3, 4, checkpoint)
            policy.on_end(WorkflowKey("", f"c{i}-2"), t + 6)
            t += 10.0
        old_question = question
        new_question, new_answer = Node("q_new"), Node("a_new")
        serve(policy, [sys_prompt, new_question, new_answer], "c-new-1", "assistant", t, 1, 2)  # not ended yet
        return policy, sys_prompt, old_question, new_question, new_answer

    policy, sys_prompt, old_question, new_question, new_answer = chat("pbkv")
    # 2 of each conversation's 6 retired nodes read again, counted once whether or not the server tagged the
    # prompt before the request finished
    assert policy.retired_reads.share(["assistant"]) == pytest.approx(2 / 6, abs=0.02)
    assert chat("pbkv", checkpoint=True)[0].retired_reads.share(["assistant"]) == pytest.approx(2 / 6, abs=0.02)
    assert policy.priority(new_answer)[0] == policy.priority(new_question)[0] == 0
    assert policy.priority(sys_prompt)[0] == 1  # the assistant's fixed prompt keeps its demand
    # the unread answer goes first; then, without the ages' values, LRU: the older conversation's prompt
    # before the new one's
    assert eviction_order(policy, [new_question, old_question, new_answer])[0] == "a_new"
    lru_within, _, old_q, new_q, new_a = chat("pbkv/-retired-ages")
    assert eviction_order(lru_within, [new_q, old_q, new_a]) == ["a_new", "q39", "q_new"]

    without, *_, answer_without = chat("pbkv/-retired-evidence")
    assert without.priority(answer_without)[0] == 1  # the estimate (END) outranked the evidence

    # An agent with no evidence of its own keeps the paper's rule, however often others re-read theirs.
    newcomer = Node("coder_history")
    serve(policy, [Node("sys_coder"), newcomer], "w-coder", "coder", 500.0, 0, 1)
    assert policy.retired_reads.share(["coder"]) == 0.0
    assert policy.priority(newcomer)[0] == 1

    agents = make_policy("pbkv")
    t = 0.0
    for i in range(40):  # agent workflows: nobody reads what an ended workflow wrote
        serve(agents, [Node(f"sys_p{i}"), Node(f"plan{i}")], f"w{i}", "planner", t, 0, 1)
        serve(agents, [Node(f"sys_c{i}"), Node(f"code{i}")], f"w{i}", "coder", t + 1, 0, 1)
        agents.on_end(WorkflowKey("", f"w{i}"), t + 2)
        t += 3.0
    ending = Node("code_new")
    serve(agents, [Node("plan_new")], "w-new", "planner", t, 0, 1)
    serve(agents, [Node("sys_c"), ending], "w-new", "coder", t + 1, 0, 1)  # forecast: END next
    assert agents.retired_reads.share(["coder"]) == 0.0
    assert agents.priority(ending)[0] == 1


def test_retired_ages_value_a_node_by_its_chance_of_a_read_before_eviction_at_its_age():
    """Where conversations come back after about 10 s and the cache turns over in 2, a node that outlived the
    turnover is worth more than a young one (LRU would evict it first); where they come back after 10 s and
    the rest are evicted at 100 s (ended conversations), an old node is worth least (LRU's order). An agent
    whose retired cache is never read again is worth less than one whose is, at the same age."""
    untouched = RetiredAges()
    untouched.evicted(["coder"], 5.0, 100)
    untouched.freeze()
    assert not untouched.learned and untouched.value(["coder"], 5.0) == 0.0  # agent workflows: the tier stays LRU

    thrashing = RetiredAges()
    for _ in range(20):
        thrashing.read(["assistant"], 10.0, 100)
        thrashing.evicted(["assistant"], 2.0, 400)
    thrashing.freeze()
    assert thrashing.learned
    assert thrashing.value(["assistant"], 8.0) == 1.0
    assert thrashing.value(["assistant"], 0.5) == pytest.approx(100 / 500)

    roomy = RetiredAges()
    for _ in range(20):
        roomy.read(["assistant"], 10.0, 300)
        roomy.evicted(["assistant"], 100.0, 100)
        roomy.evicted(["coder"], 100.0, 100)
    roomy.freeze()
    assert roomy.value(["assistant"], 50.0) == 0.0 and roomy.value(["assistant"], 1.0) == pytest.approx(0.75)
    assert roomy.value(["coder"], 1.0) < roomy.value(["assistant"], 1.0)
    assert roomy.value(["newcomer"], 1.0) == roomy.value([], 1.0)  # no evidence of its own: every agent's


def test_retired_ages_keep_a_shared_prefix_read_at_a_slow_steady_rate_past_the_turnover():
    """Chat where each request is a workflow of its own, ended at once, and a prompt prefix that no tag names
    (a system prompt sent as plain text) is shared by many of them: nodes read by one request at most are
    evicted by 30 s, so by raw age the prefix, read once a minute, is worth nothing at 100 s idle and goes
    before a question asked 2 s ago (LRU's order, below lfu's). Counted in its own mean interval between the
    requests whose cached prefix ended at it, the prefix is young, and its class of nodes is read again."""
    policy = make_policy("pbkv")
    shared = Node("system")
    for i in range(9):  # the first request writes the prefix, the next eight read it and go on past it
        touch(policy, [shared, Node(f"q{i}")], f"turn-{i}", "chat", 60.0 * i, matched=10 if i else 0)
        policy.on_end(WorkflowKey("", f"turn-{i}"), 60.0 * i)
    assert tags_of(shared).stops == 8 and tags_of(shared).hits == 8
    ages = policy.retired_ages
    for _ in range(20):
        ages.read(["chat"], 5.0, 100)  # one request's nodes: some read again soon,
        ages.evicted(["chat"], 30.0, 400)  # most evicted by 30 s
        ages.read(["chat"], 3.0, 100, stops=8)  # shared prefixes, in their own intervals: read again
    ages.freeze()
    question = Node("question")
    now = 60.0 * 8 + 100.0
    touch(policy, [question], "turn-q", "chat", now - 2.0)
    policy.on_end(WorkflowKey("", "turn-q"), now - 2.0)
    touch(policy, [Node("other")], "turn-o", "other", now)  # the clock moves on
    assert RetiredAges.age_unit(tags_of(shared)) == pytest.approx(60.0)
    assert RetiredAges.age_unit(tags_of(question)) == 1.0  # never read: counted in seconds
    assert eviction_order(policy, [shared, question]) == ["question", "system"]


def test_retired_ages_rekey_a_node_when_its_age_enters_another_bucket():
    """A retired key reads the node's age: the engine's heap learns that it changed when the age crosses
    into the next bucket, without the node being touched."""
    policy = make_policy("pbkv")
    for _ in range(4):
        policy.retired_ages.read(["assistant"], 10.0, 100)
        policy.retired_ages.evicted(["assistant"], 2.0, 400)
    policy.retired_ages.freeze()
    node = Node("answer")
    touch(policy, [node], "turn-1", "assistant", 0.0)
    policy.on_end(WorkflowKey("", "turn-1"), 0.0)
    young = policy.priority(node)
    assert young[0] == 0 and tags_of(node).kept.rekey_at == RetiredAges.bucket_end(0.0)
    policy.take_changed_keys()
    touch(policy, [Node("other")], "turn-2", "other", 8.0)  # the clock moves on; the node is untouched
    changed = policy.take_changed_keys()
    assert changed is not None and any(t is tags_of(node) for t in changed)
    assert policy.priority(node)[2] > young[2]


def test_retired_ages_reschedule_every_node_after_dropping_a_full_schedule(monkeypatch):
    """The schedule of re-keys is bounded: when it is full of live nodes it is dropped, and each node is
    scheduled again the next time its key is computed (none is left with a re-key that never comes)."""
    import agentcache.policy.pbkv.keys as keys

    monkeypatch.setattr(keys, "MAX_REKEYS", 4)
    policy = make_policy("pbkv")
    policy.retired_ages.read(["assistant"], 10.0, 100)
    policy.retired_ages.freeze()
    nodes = [Node(f"turn{i}") for i in range(6)]
    for i, node in enumerate(nodes):
        touch(policy, [node], f"turn-{i}", "assistant", float(i))
        policy.on_end(WorkflowKey("", f"turn-{i}"), float(i))
    for node in nodes:
        policy.priority(node)
    assert len(policy.keys.rekeys) <= 4
    policy.keys.new_epoch()  # every key is computed again
    for node in nodes:
        policy.priority(node)
    scheduled = {id(t) for _, _, t in policy.keys.rekeys}
    assert scheduled and all(tags_of(node).kept.rekey_at == 0.0 or id(tags_of(node)) in scheduled for node in nodes)


def test_belady_evicts_the_farthest_next_use():
    next_use = {"soon": 3, "late": 10, "never": math.inf}
    policy = make_policy("belady", next_use=lambda node: next_use[node.name])
    nodes = [Node("late"), Node("never"), Node("soon")]
    assert eviction_order(policy, nodes) == ["never", "late", "soon"]


def test_registry_leases_retire_silent_workflows():
    registry = WorkflowRegistry(lease_s=10)
    policy = make_policy("lifecycle", registry=registry)
    n = Node("n")
    touch(policy, [n], "quiet", "a", 0)
    touch(policy, [Node("m")], "busy", "a", 5)
    assert registry.is_active(WorkflowKey("", "quiet"))
    touch(policy, [Node("k")], "busy", "a", 12)  # 12 s after quiet's last request
    assert not registry.is_active(WorkflowKey("", "quiet")) and registry.expired_count == 1
    assert policy.classify(n) == NodeClass.RETIRED


def test_tags_record_workflows_agents_fixed_and_hits():
    policy = make_policy("lru")
    a, b = Node("a", 100), Node("b", 50)
    touch(policy, [a, b], "w", "coder", 0, fixed_tokens=100, matched=120)
    ta, tb = tags_of(a), tags_of(b)
    assert (
        set(ta.workflows) == {WorkflowKey("", "w")}
        and set(ta.workflows[WorkflowKey("", "w")]) == {"coder"}
        and ta.fixed_agents == {"coder"}
        and ta.depth == 100
        and ta.hits == 1
    )
    assert tb.fixed_agents == set() and tb.depth == 150 and tb.hits == 0


def test_unknown_policy_and_missing_inputs_are_clear_errors():
    from agentcache.policy import PolicyConfigError

    with pytest.raises(PolicyConfigError, match="unknown policy"):
        make_policy("lrux")
    with pytest.raises(PolicyConfigError, match="call graph"):
        make_policy("kvflow")
    with pytest.raises(PolicyConfigError, match="offline"):
        make_policy("belady")
    with pytest.raises(PolicyConfigError, match="unknown ingredient"):
        make_policy("pbkv/-magic")
    with pytest.raises(PolicyConfigError, match="unknown ingredient"):
        make_policy("pbkv/timing")
    assert make_policy("pbkv/-timing/+cost").ingredients.cost


def attributes(obj: object) -> dict[str, object]:
    """An object's attributes, its class compiled (agentcache.compiled: mypyc lists them on the class) or not."""
    names = [name for name in getattr(type(obj), "__mypyc_attrs__", ()) if name != "__dict__" and hasattr(obj, name)]
    return {**{name: getattr(obj, name) for name in names}, **getattr(obj, "__dict__", {})}


def test_policy_work_per_request_does_not_grow_with_retired_workflows():
    """pbkv's bookkeeping per request (timing weights, keys recomputed) and every table it keeps stay the same
    after 100,000 ended workflows as after 1,000: nothing on the hot path grows with workflows ever seen."""
    policy = make_policy("pbkv")
    shared = {agent: Node(f"sys_{agent}") for agent in ("planner", "coder")}
    live: list[Node] = []
    clock = count()

    def workflows(n: int) -> None:
        for _ in range(n):
            i = next(clock)
            for step, agent in enumerate(("planner", "coder")):
                own = Node(f"w{i}.{step}")
                touch(policy, [shared[agent], own], f"w{i}", agent, i + step / 2, fixed_tokens=10)
                live.append(own)
                del live[:-32]
                for node in (*shared.values(), *live):  # an eviction round over the leaves a cache would hold
                    policy.priority(node)
            policy.on_end(WorkflowKey("", f"w{i}"), i + 0.75)

    work = {"weights_computed": policy.timing, "keys_computed": policy}

    def per_request(n: int) -> dict[str, float]:
        before = {name: getattr(owner, name) for name, owner in work.items()}
        workflows(n)
        return {name: (getattr(owner, name) - before[name]) / (2 * n) for name, owner in work.items()}

    def table_sizes() -> dict[str, int]:
        owners = {
            "policy": policy,
            "registry": policy.registry,
            **{part: getattr(policy, part) for part in ("reuse", "forecasts", "timing", "demand", "keys")},
            "retired_reads": policy.retired_reads,
            "retired_ages": policy.retired_ages,
        }
        return {
            f"{owner}.{name}": len(value)
            for owner, obj in owners.items()
            for name, value in attributes(obj).items()
            if hasattr(value, "__len__") and not isinstance(value, str)
        }

    workflows(1_000)
    early, early_sizes = per_request(1_000), table_sizes()
    workflows(97_000)
    late, late_sizes = per_request(1_000), table_sizes()
    assert early["weights_computed"] > 0 and early["keys_computed"] > 0
    for name in work:
        assert late[name] <= early[name] * 1.05 + 0.05, (name, early, late)
    grown = {name: (early_sizes[name], size) for name, size in late_sizes.items() if size > early_sizes[name] + 8}
    assert not grown, grown
