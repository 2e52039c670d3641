import pytest

from agentcache.predictor import END, MarkovPredictor


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
    assert_valid(m.predict(["never-seen"]), 3)
    train(m, [["a", "b"]])
    assert_valid(m.predict(["never-seen"]), 3)


def test_markov_n_sees_history_markov1_cannot():
    # a -> c -> (x after a; y after b);  b -> c -> y
    paths = [["a", "c", "x"], ["b", "c", "y"]]
    m1, m2 = MarkovPredictor(order=1), MarkovPredictor(order=2)
    train(m1, paths)
    train(m2, paths)
    row1, row2 = m1.predict(["a", "c"])[0], m2.predict(["a", "c"])[0]
    assert row1["x"] == pytest.approx(row1["y"], abs=0.05)
    assert row2["x"] > 0.8
    assert_valid(m2.predict(["a", "c"]), 3)


def test_bad_arguments():
    with pytest.raises(ValueError):
        MarkovPredictor(order=0)
    with pytest.raises(ValueError):
        MarkovPredictor(horizon=0)
