import pytest

from agentcache.predictor import END, MarkovPredictor
from agentcache.predictor.base import DEFAULT_HORIZON


def assert_valid(rows, horizon):
    assert len(rows) == horizon
    previous_end = 0.0
    for row in rows:
        assert all(p >= 0 for p in row.values())
        assert sum(row.values()) == pytest.approx(1.0)
        assert row.get(END, 0.0) >= previous_end - 1e-12  # END is absorbing
        previous_end = row.get(END, 0.0)


def train(predictor, paths, times=20):
    for _ in range(times):
        for path in paths:
            for i in range(len(path)):
                predictor.observe(path[:i], path[i])
            predictor.observe(path, END)


def test_markov1_learns_transitions_and_rows_are_valid():
    m = MarkovPredictor(order=1, horizon=3)
    train(m, [["planner", "coder", "tester"]])
    rows = m.predict(["planner"])
    assert_valid(rows, 3)
    assert max(rows[0], key=rows[0].get) == "coder"
    assert max(rows[1], key=rows[1].get) == "tester"
    assert max(rows[2], key=rows[2].get) == END
    first = m.predict([])[0]
    assert max(first, key=first.get) == "planner"  # what a new workflow calls


def test_unseen_agent_gets_a_valid_uninformed_forecast():
    m = MarkovPredictor()
    assert_valid(m.predict(["never-seen"]), DEFAULT_HORIZON)
    train(m, [["a", "b"]])
    assert_valid(m.predict(["never-seen"]), DEFAULT_HORIZON)


def test_markov_n_sees_history_markov1_cannot():
    # a -> c -> (x after a; y after b);  b -> c -> y
    paths = [["a", "c", "x"], ["b", "c", "y"]]
    m1, m2 = MarkovPredictor(order=1), MarkovPredictor(order=2)
    train(m1, paths)
    train(m2, paths)
    row1, row2 = m1.predict(["a", "c"])[0], m2.predict(["a", "c"])[0]
    assert row1["x"] == pytest.approx(row1["y"], abs=0.05)
    assert row2["x"] > 0.8
    assert_valid(m2.predict(["a", "c"]), DEFAULT_HORIZON)


def test_bad_arguments():
    with pytest.raises(ValueError):
        MarkovPredictor(order=0)
    with pytest.raises(ValueError):
        MarkovPredictor(horizon=0)
    with pytest.raises(ValueError):
        MarkovPredictor(max_agents=0)


def test_agent_ids_that_never_repeat_keep_the_state_and_the_forecast_bounded():
    m = MarkovPredictor(order=3, max_agents=8, max_contexts=32)
    train(m, [["planner", "coder", "tester"]])
    for i in range(500):  # a client that sends a new agent id with every request
        m.observe([f"agent-{i - 2}", f"agent-{i - 1}"], f"agent-{i}")
    assert len(m.outcomes) == 8 + 1, "the 8 most recently observed agents, and END"
    assert "agent-499" in m.outcomes and "agent-491" not in m.outcomes and "planner" not in m.outcomes
    assert len(m.counts) <= 32 and () in m.counts, "the global prior is never forgotten"
    rows = m.predict(["agent-497", "agent-498"])
    assert_valid(rows, DEFAULT_HORIZON)
    assert max(rows[0], key=rows[0].get) == "agent-499"
    assert set(rows[2]) <= set(m.outcomes)


def test_a_rollout_follows_at_most_max_states_contexts_and_stays_a_forecast():
    m = MarkovPredictor(order=2)
    agents = [f"a{i}" for i in range(30)]
    for i, a in enumerate(agents):  # every agent once after every other: near-uniform rows over 30 agents
        for b in agents[i:] + agents[:i]:
            m.observe([a], b)
    m.MAX_STATES = 4
    followed = []
    next_distribution = m.next_distribution
    m.next_distribution = lambda context: followed.append(context) or next_distribution(context)
    assert_valid(m.predict([agents[0]]), DEFAULT_HORIZON)
    assert len(followed) <= 1 + 2 * (4 + 1), "without the cap, step 3 follows ~900 contexts"


def test_forecasts_are_rerolled_once_a_share_more_was_learned_not_at_every_transition():
    """A busy server learns thousands of transitions: re-rolling every forecast after every 16 of them made the
    forecaster pbkv's largest cost per request (docs/results/overhead.md), where they barely move it."""
    m = MarkovPredictor(order=1, refresh_every=4, refresh_share=8)
    train(m, [["planner", "coder", "tester"]], times=100)  # 400 transitions learned
    m.observe(["planner"], "reviewer")  # a new outcome re-rolls at once: no forecast may lack it
    rows = m.predict(["planner"])
    assert "reviewer" in rows[0]
    kept = 0
    while m.predict(["planner"]) is rows:
        m.observe(["planner"], "coder")
        kept += 1
    assert 401 // 8 <= kept <= 460 // 8 + 1, "kept until an eighth more than it knew was learned"
    small = MarkovPredictor(order=1, refresh_every=4, refresh_share=8)
    train(small, [["planner", "coder"]], times=1)
    first = small.predict(["planner"])
    for _ in range(4):
        small.observe(["planner"], "coder")
    assert small.predict(["planner"]) is not first, "refresh_every bounds the wait while little is known"
    with pytest.raises(ValueError, match="refresh_share"):
        MarkovPredictor(refresh_share=0)
