"""Predictor faults fall back to Markov-1 for that decision, and are counted."""

import math
import time

import pytest

import agentcache.predictor.guard as guard_module
from agentcache.policy.pbkv import PBKVPolicy
from agentcache.predictor import END, MarkovPredictor, Predictor
from agentcache.predictor.guard import GuardedPredictor, is_forecast


class Faulty(Predictor):
    def __init__(self, mode):
        super().__init__(horizon=2)
        self.mode = mode

    def predict(self, path, hidden=None):
        if self.mode == "raise":
            raise RuntimeError("model crashed")
        if self.mode == "nan":
            return [{"a": math.nan, END: 1.0}, {END: 1.0}]
        if self.mode == "short":
            return [{END: 1.0}]
        if self.mode == "slow":
            time.sleep(0.02)
        return [{"a": 0.5, END: 0.5}, {END: 1.0}]

    def observe(self, path, next_agent):
        if self.mode == "raise":
            raise RuntimeError("cannot learn")


@pytest.mark.parametrize(
    "mode, fault", [("raise", "error"), ("nan", "invalid"), ("short", "invalid"), ("slow", "overrun")]
)
def test_faults_fall_back_and_are_counted(mode, fault):
    guard = GuardedPredictor(Faulty(mode), budget_ms=5.0)
    for path in (["x"], ["x", "y"]):
        guard.observe(path[:-1], path[-1])
    rows = guard.predict(["x"])
    assert is_forecast(rows, 2)
    assert rows == guard.fallback.predict(["x"])
    assert guard.faults[fault] >= 1


def test_a_healthy_predictor_passes_through_and_no_budget_means_no_clock():
    guard = GuardedPredictor(Faulty("slow"), budget_ms=None)
    assert guard.predict(["x"]) == [{"a": 0.5, END: 0.5}, {END: 1.0}] and not guard.faults


def test_pbkv_keeps_ranking_with_a_broken_predictor():
    policy = PBKVPolicy(predictor=Faulty("raise"))
    from agentcache.tags import Tags

    class Node:
        key = [0] * 10
        hit_count = 0
        last_access_time = 1

    node = Node()
    for i, agent in enumerate(["a", "b", "a"]):
        tags = Tags(workflow="w", agent=agent, fixed_tokens=0)
        policy.on_request(tags, float(i))
        policy.tag_path([node], tags, float(i), 0)
    assert policy.priority(node)[0] == 1 and policy.predictor.faults["error"] > 0
    assert isinstance(policy.predictor.fallback, MarkovPredictor)


def test_a_forecast_returned_again_is_checked_once_and_a_new_one_always():
    class Kept(Predictor):  # keeps its forecast per context, as the online Markov does
        def __init__(self):
            super().__init__(horizon=2)
            self.rows = [{"a": 0.5, END: 0.5}, {END: 1.0}]

        def predict(self, path, hidden=None):
            return self.rows

    inner = Kept()
    guard = GuardedPredictor(inner, budget_ms=None)
    assert guard.predict(["x"]) is inner.rows  # checked, and passed
    inner.rows[0]["a"] = math.nan  # changed in place, which a predictor must not do: not checked again
    for _ in range(4):
        assert guard.predict(["x"]) is inner.rows
    assert guard.faults["invalid"] == 0
    inner.rows = [{"a": math.nan, END: 1.0}, {END: 1.0}]  # a new object: checked, and caught
    assert guard.predict(["x"]) == guard.fallback.predict(["x"]) and guard.faults["invalid"] == 1


class BreaksLater(Predictor):
    def __init__(self):
        super().__init__(horizon=2)
        self.broken = False

    def predict(self, path, hidden=None):
        if self.broken:
            raise RuntimeError("model crashed")
        return [{"a": 0.5, END: 0.5}, {END: 1.0}]


def _teach(predictors, run):
    for predictor in predictors:
        for before, agent in zip([run[:k] for k in range(len(run))], run):
            predictor.observe(before, agent)
        predictor.observe(run, END)


def test_the_fallback_forecasts_from_the_transitions_before_the_first_fault_and_every_one_after():
    """The fallback is taught only when first needed: it must then know what came before, and learn on after."""
    inner = BreaksLater()
    guard = GuardedPredictor(inner, budget_ms=None)
    taught = MarkovPredictor(order=1, horizon=2)  # what the fallback would know had it learned all along
    runs = [["x", "y"], ["x", "y", "z"], ["w"]] * 5
    for i, run in enumerate(runs):
        _teach((guard, taught), run)
        if i == 7:  # the predictor breaks halfway: later transitions are taught as they come
            inner.broken = True
            assert guard.predict(["x"]) == taught.predict(["x"])
    assert guard.faults["error"] == 1
    for path in ([], ["x"], ["y"], ["z"], ["w"]):
        assert guard.predict(path) == taught.predict(path)
    assert guard.predict(["x"])[0]["y"] > 0.5


def test_until_the_first_fault_the_guard_keeps_only_the_most_recent_transitions(monkeypatch):
    monkeypatch.setattr(guard_module, "MAX_UNTAUGHT", 4)
    inner = BreaksLater()
    guard = GuardedPredictor(inner, budget_ms=None)
    _teach([guard], ["x", "y", "y", "y"])  # 5 transitions: the first one, START -> x, is dropped
    recent = MarkovPredictor(order=1, horizon=2)
    for before, agent in ((["x"], "y"), (["x", "y"], "y"), (["x", "y", "y"], "y"), (["x", "y", "y", "y"], END)):
        recent.observe(before, agent)
    inner.broken = True
    assert guard.predict([]) == recent.predict([]) and guard.predict(["y"]) == recent.predict(["y"])


@pytest.mark.parametrize("bad", [math.nan, -0.5, math.inf])
def test_a_row_that_cannot_be_summed_is_no_forecast_and_no_error(bad):
    """A predictor's output never raises out of the guard: an int too large for a float beside a bad value."""
    assert not is_forecast([{"a": bad, "b": 10**400}], 1)
    guard = GuardedPredictor(Faulty("ok"), budget_ms=None)
    guard.inner.predict = lambda path, hidden=None: [{"a": bad, "b": 10**400}, {END: 1.0}]
    assert is_forecast(guard.predict(["x"]), 2) and guard.faults["invalid"] == 1
