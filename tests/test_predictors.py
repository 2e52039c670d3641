"""The predictors of issue 6: static graph, Markov-N, neural, noise; training, evaluation, specs and CLI."""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import replace

import pytest

torch = pytest.importorskip("torch")

from agentcache.policy.pbkv import DEFAULT_ORDER, PBKVPolicy  # noqa: E402
from agentcache.predictor import (  # noqa: E402
    END,
    MarkovPredictor,
    NeuralConfig,
    NeuralPredictor,
    NoisyPredictor,
    Predictor,
    PredictorSpec,
    StaticGraphPredictor,
)
from agentcache.predictor.base import DEFAULT_HORIZON  # noqa: E402
from agentcache.predictor.cli import register  # noqa: E402
from agentcache.predictor.neural import compose_hazards  # noqa: E402
from agentcache.predictor.training import (  # noqa: E402
    TrainConfig,
    evaluate,
    train_neural,
    training_examples,
    warm_up,
    workflow_paths,
)
from agentcache.trace import End, Meta, Request, Segment, Trace, write_trace  # noqa: E402
from agentcache.workloads import GenConfig, generate  # noqa: E402

SMALL = NeuralConfig(dim=16, heads=2, mlp_hidden=64)
CODE_RETRY_GRAPH = {"planner": ["coder"], "coder": ["tester"], "tester": ["analyzer"], "analyzer": ["coder"]}


def assert_valid(rows, horizon):
    assert len(rows) == horizon
    previous_end = 0.0
    for row in rows:
        assert all(p >= 0 for p in row.values())
        assert sum(row.values()) == pytest.approx(1.0, abs=1e-6)
        assert row.get(END, 0.0) >= previous_end - 1e-9  # END is absorbing
        previous_end = row.get(END, 0.0)


def top(row):
    return max(row, key=row.get)


def every_state(trace):
    for wf in workflow_paths(trace).values():
        for called in range(len(wf.agents) + 1):
            yield wf.agents[:called]


@pytest.fixture(scope="module")
def code_retry_model():
    train = [generate("code-retry", GenConfig(workflows=120, seed=s)) for s in (11, 12)]
    predictor, losses = train_neural(train, 3, TrainConfig(epochs=20), SMALL, progress=False)
    return predictor, losses, train


# ---------------------------------------------------------------- validity of every predictor


@pytest.mark.parametrize("spec", ["markov", "markov-n:3", "static", "noise:0.3:markov-n:2"])
def test_online_predictors_give_valid_rows_on_every_family(small_traces, spec):
    for trace in small_traces.values():
        predictor = PredictorSpec.parse(spec).build(trace.meta.call_graph)
        warm_up(predictor, [trace])
        for path in every_state(trace):
            assert_valid(predictor.predict(path), DEFAULT_HORIZON)
        assert_valid(predictor.predict(["never-seen"]), DEFAULT_HORIZON)


def test_neural_rows_are_valid_for_any_path(code_retry_model):
    predictor, _, train = code_retry_model
    for path in list(every_state(train[0]))[:200]:
        assert_valid(predictor.predict(path), 3)
    long = ["planner"] + ["coder", "tester", "analyzer"] * 30  # beyond the window and every trained length
    for path in ([], ["never-seen"], ["planner", "never-seen", "coder"], long):
        assert_valid(predictor.predict(path), 3)


def test_hazard_composition_is_absorbing_and_matches_inference():
    logits = torch.randn(5, 4, 6) * 3
    rows = compose_hazards(logits).exp()
    assert torch.allclose(rows.sum(-1), torch.ones(5, 4), atol=1e-5)
    assert (rows[:, 1:, -1] >= rows[:, :-1, -1] - 1e-6).all()  # END non-decreasing
    predictor = NeuralPredictor(["a", "b", "c", "d", "e"], torch.zeros(8, 8), horizon=4, config=SMALL)
    composed = predictor.compose_rows(torch.softmax(logits[0], -1).tolist())
    for k, row in enumerate(composed):
        assert list(row.values()) == pytest.approx(rows[0, k].tolist(), abs=1e-6)


# ---------------------------------------------------------------- static graph


def test_static_walks_the_graph_uniformly():
    static = StaticGraphPredictor({"a": ["b", "c"], "b": ["d"], "c": []}, horizon=3)
    rows = static.predict(["a"])
    assert_valid(rows, 3)
    assert rows[0] == pytest.approx({"b": 0.5, "c": 0.5, END: 0.0})
    assert rows[1] == pytest.approx({"d": 0.5, END: 0.5})  # c has no successors; d neither
    assert rows[2] == pytest.approx({END: 1.0})
    assert static.predict([])[0] == pytest.approx({"a": 1.0, END: 0.0})  # the only root
    unknown = static.predict(["zz"])[0]
    assert set(unknown) == {"a", "b", "c", "d", END} and unknown[END] == pytest.approx(0.2)


def test_static_learns_end_online_only_when_asked():
    learner = StaticGraphPredictor(CODE_RETRY_GRAPH, learn_end=True)
    frozen = StaticGraphPredictor(CODE_RETRY_GRAPH, learn_end=False)
    assert learner.predict(["tester"])[0][END] == 0.0  # a cycle: the pure graph never ends
    for predictor in (learner, frozen):
        for _ in range(9):
            predictor.observe(["planner", "coder", "tester"], END)
    assert learner.predict(["tester"])[0][END] == pytest.approx(0.9)  # 9 / (9 + 1)
    assert frozen.predict(["tester"])[0][END] == 0.0
    assert_valid(learner.predict(["coder"]), DEFAULT_HORIZON)


def test_the_static_predictor_needs_a_call_graph():
    trace = generate("code-retry", GenConfig(workflows=3))
    assert PredictorSpec.parse("static").build(trace.meta.call_graph).successors == CODE_RETRY_GRAPH
    for graph in (None, {}):
        with pytest.raises(ValueError, match="call graph"):
            PredictorSpec.parse("static").build(graph)


# ---------------------------------------------------------------- noise


class FixedPredictor(Predictor):
    def __init__(self, rows):
        super().__init__(len(rows))
        self.rows, self.observed = rows, []

    def predict(self, path, hidden=None):
        return self.rows

    def observe(self, path, next_agent):
        self.observed.append((tuple(path), next_agent))


def test_noise_mixes_each_row_with_uniform_and_keeps_end_absorbing():
    inner = FixedPredictor([{"a": 1.0, END: 0.0}, {"b": 0.5, END: 0.5}, {END: 1.0}])
    noisy = NoisyPredictor(inner, 0.3)
    rows = noisy.predict(["x"])
    assert_valid(rows, 3)
    u = 0.3 / 3  # outcomes: a, b, END
    assert rows[0] == pytest.approx({"a": 0.7 + u, "b": u, END: u})
    assert rows[1] == pytest.approx({"a": u, "b": 0.35 + u, END: 0.35 + u})
    assert rows[2] == pytest.approx({"a": u, "b": u, END: 0.7 + u})
    assert NoisyPredictor(inner, 0.0).predict([])[0] == {"a": 1.0, "b": 0.0, END: 0.0}
    assert all(p == pytest.approx(1 / 3) for row in NoisyPredictor(inner, 1.0).predict([]) for p in row.values())
    noisy.observe(["x"], END)
    assert inner.observed == [(("x",), END)]
    with pytest.raises(ValueError, match="lam"):
        NoisyPredictor(inner, 1.5)


# ---------------------------------------------------------------- examples and evaluation


def test_examples_pad_with_end_and_leave_unended_futures_unknown():
    wf = workflow_paths(_two_workflows(ended=False))
    assert wf["w1"].future(1, 3) == ("b", END, END)
    assert wf["w2"].future(1, 3) == ("b", None, None)  # never ended: the trace does not say
    examples = training_examples([_two_workflows(ended=False)], 3)
    assert ((), None, ("a", "b", END)) in [(e.path, e.hidden, e.targets) for e in examples]
    assert all(e.targets[0] is not None for e in examples)  # w2's last state has nothing to learn


class RecordingPredictor(FixedPredictor):
    def predict(self, path, hidden=None):
        self.observed.append(("predict", tuple(path)))
        return self.rows


def test_evaluation_is_prequential_and_skips_unknown_steps():
    predictor = RecordingPredictor([{"b": 1.0}, {END: 1.0}, {END: 1.0}])
    result = evaluate(predictor, _two_workflows(ended=False))
    assert predictor.observed[:5] == [
        ((), "a"),  # observe the transition a request reveals, then forecast the new state
        ("predict", ("a",)),
        (("a",), "b"),
        ("predict", ("a", "b")),
        (("a", "b"), END),  # the end event
    ]
    assert result.states == 4
    # k=1 scores w1@1 (b), w1@2 (END), w2@1 (b); w2@2's future is unknown. k=2, 3 score w1's two states only.
    assert result.top1 == pytest.approx([2 / 3, 1.0, 1.0])
    assert result.log_loss == pytest.approx([-math.log(1e-6) / 3, 0.0, 0.0])
    assert result.to_json()["top1"] == result.top1


def _two_workflows(ended: bool) -> Trace:
    seg = (Segment("s", 1),)
    events = [
        Request(0.0, "w1", "a", seg, 0, 1),
        Request(1.0, "w1", "b", seg, 0, 1),
        End(2.0, "w1"),
        Request(3.0, "w2", "a", seg, 0, 1),
        Request(4.0, "w2", "b", seg, 0, 1),
    ]
    if ended:
        events.append(End(5.0, "w2"))
    return Trace(Meta(name="two"), events)


# ---------------------------------------------------------------- neural: training, files, semantic input


def test_training_converges_on_a_deterministic_pipeline():
    train = [generate("pipeline", GenConfig(workflows=30, seed=1))]
    predictor, losses = train_neural(train, 3, TrainConfig(epochs=15), SMALL, progress=False)
    assert losses[-1] < 0.05 * losses[0]
    result = evaluate(predictor, generate("pipeline", GenConfig(workflows=20, seed=2)))
    assert result.top1 == [1.0, 1.0, 1.0]  # the second round's editor ends: history Markov-1 cannot see


def test_training_is_deterministic_for_a_seed():
    train = [generate("fact-verify", GenConfig(workflows=20, seed=4))]
    first, _ = train_neural(train, 2, TrainConfig(epochs=2, seed=7), SMALL, progress=False)
    second, _ = train_neural(train, 2, TrainConfig(epochs=2, seed=7), SMALL, progress=False)
    path = ["decomposer", "retriever"]
    assert first.predict(path) == second.predict(path)


def test_save_load_round_trip_gives_identical_forecasts(code_retry_model, tmp_path):
    predictor, _, train = code_retry_model
    predictor.save(tmp_path / "model.pt")
    loaded = PredictorSpec.parse(f"neural:{tmp_path / 'model.pt'}").build()
    assert isinstance(loaded, NeuralPredictor) and loaded.agents == predictor.agents
    for path in list(every_state(train[0]))[:50] + [["never-seen"]]:
        assert loaded.predict(path) == predictor.predict(path)


def test_load_rejects_missing_and_foreign_files(tmp_path):
    with pytest.raises(ValueError, match="no neural predictor file"):
        NeuralPredictor.load(tmp_path / "missing.pt")
    (tmp_path / "junk.pt").write_text("not a model")
    with pytest.raises(ValueError, match="not a neural predictor file"):
        NeuralPredictor.load(tmp_path / "junk.pt")
    torch.save({"something": 1}, tmp_path / "other.pt")
    with pytest.raises(ValueError, match="not a neural predictor file"):
        NeuralPredictor.load(tmp_path / "other.pt")


def test_semantic_vector_carries_what_the_path_cannot():
    """After `router`, the next agent is `a` or `b` at random; only prompt_hidden tells which."""

    def trace(seed: int) -> Trace:
        gen = torch.Generator().manual_seed(seed)
        events = []
        for i in range(150):
            goes_to_a = bool(torch.rand(1, generator=gen) < 0.5)
            hidden = (1.0 if goes_to_a else -1.0, float(torch.randn(1, generator=gen)))
            seg = (Segment(f"t{i}", 5),)
            events += [
                Request(2.0 * i, f"w{i}", "router", seg, 0, 1, prompt_hidden=hidden),
                Request(2.0 * i + 1, f"w{i}", "a" if goes_to_a else "b", seg, 0, 1),
                End(2.0 * i + 1.5, f"w{i}"),
            ]
        return Trace(Meta(name="router"), events)

    predictor, _ = train_neural([trace(1)], 2, TrainConfig(epochs=30), SMALL, progress=False)
    assert predictor.hidden_dim == 2
    result = evaluate(predictor, trace(2))
    assert result.top1[0] > 0.95
    assert result.top1[0] > evaluate(MarkovPredictor(horizon=2), trace(2)).top1[0] + 0.25
    with pytest.raises(ValueError, match="takes 2"):
        predictor.predict(["router"], hidden=[1.0, 2.0, 3.0])


# ---------------------------------------------------------------- specs


def test_predictor_specs_parse_once_and_build_what_they_name():
    graph = generate("code-retry", GenConfig(workflows=2)).meta.call_graph
    build = lambda text, **kw: PredictorSpec.parse(text).build(graph, **kw)  # noqa: E731
    assert isinstance(build("markov"), MarkovPredictor) and build("markov").order == 1
    assert build("markov-n:3", horizon=4).order == 3 and build("markov-n:3", horizon=4).horizon == 4
    assert isinstance(build("static"), StaticGraphPredictor)
    noisy = build("noise:0.2:markov-n:2")
    assert isinstance(noisy, NoisyPredictor) and noisy.lam == 0.2 and noisy.inner.order == 2
    assert isinstance(build("noise:0.1:static").inner, StaticGraphPredictor)
    for text in ("markov", "markov-n:3", "static", "neural:m.pt", "noise:0.2:markov-n:2"):
        assert str(PredictorSpec.parse(text)) == text


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("lru", "unknown predictor 'lru'"),
        ("", "unknown predictor ''"),
        ("markov:2", "unknown predictor"),
        ("markov-n:x", "integer order"),
        ("markov-n:0", "order must be >= 1"),
        ("static", "call graph"),
        ("neural", "needs a model file"),
        ("neural:/nonexistent/model.pt", "no neural predictor file"),
        ("noise:abc:markov", "noise needs a number"),
        ("noise:0.2", "inner predictor"),
        ("noise:2:markov", "lam must be in"),
        ("noise:0.2:bogus", "unknown predictor 'bogus'"),
    ],
)
def test_bad_predictor_specs_are_refused_clearly(spec, message):
    with pytest.raises(ValueError, match=message):
        PredictorSpec.parse(spec).build()


# ---------------------------------------------------------------- CLI


def _cli(argv):
    parser = argparse.ArgumentParser(prog="agentcache")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.run(args)


def test_cli_trains_and_evaluates(tmp_path, capsys):
    # Brackets in paths are the user's text, not rich markup (which dropped "[x]" from what was printed).
    train, test, model = tmp_path / "train.jsonl", tmp_path / "[x]test.jsonl", tmp_path / "[x]m.pt"
    write_trace(train, generate("code-retry", GenConfig(workflows=20, seed=1)))
    write_trace(test, generate("code-retry", GenConfig(workflows=10, seed=2)))
    assert _cli(["train", str(train), "-o", str(model), "--epochs", "2", "--quiet"]) == 0
    assert f"wrote {model}:" in capsys.readouterr().err
    for spec in (f"neural:{model}", "markov", "static"):
        assert _cli(["eval-predictor", str(test), "--predictor", spec, "--train", str(train), "--json"]) == 0
        report = json.loads(capsys.readouterr().out)
        assert report["predictor"] == spec and len(report["top1"]) == len(report["log_loss"]) == DEFAULT_HORIZON
        assert report["infer_ms"] > 0
    assert _cli(["eval-predictor", str(test), "--predictor", "markov-n:2"]) == 0
    out = capsys.readouterr().out
    assert "top-1" in out and f"{test}: " in out


def test_cli_bad_inputs_give_one_line_and_status_2(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"type": "request", "ts": 0}\n')
    good = tmp_path / "good.jsonl"
    write_trace(good, generate("pipeline", GenConfig(workflows=2)))
    cases = [
        (["eval-predictor", str(tmp_path / "missing.jsonl"), "--predictor", "markov"], "No such file"),
        (["eval-predictor", str(bad), "--predictor", "markov"], "bad.jsonl:1: field 'workflow'"),
        (["eval-predictor", str(good), "--predictor", "bogus"], "unknown predictor 'bogus'"),
        (["eval-predictor", str(good), "--predictor", "markov", "--train", str(bad)], "bad.jsonl:1"),
        (["eval-predictor", str(good), "--predictor", f"neural:{good}"], "not a neural predictor file"),
        (["train", str(bad), "-o", str(tmp_path / "m.pt")], "bad.jsonl:1"),
        (["train", str(good), "-o", str(tmp_path / "no" / "m.pt")], "no such directory"),
    ]
    for argv, message in cases:
        assert _cli(argv) == 2
        err = capsys.readouterr().err.strip()
        assert message in err and "\n" not in err and "Traceback" not in err


# ---------------------------------------------------------------- the key result, small


@pytest.mark.parametrize("family", ["code-retry", "group-chat"])
def test_neural_beats_markov1_beyond_one_step_on_held_out_history_dependent_traces(family, code_retry_model):
    if family == "code-retry":
        neural, _, train = code_retry_model
    else:
        train = [generate(family, GenConfig(workflows=60, seed=s)) for s in (11, 12)]
        neural, _ = train_neural(train, 3, TrainConfig(epochs=15), SMALL, progress=False)
    test = generate(family, replace(GenConfig(workflows=80), seed=99))
    markov = MarkovPredictor(order=1)
    warm_up(markov, train)
    ours, theirs = evaluate(neural, test), evaluate(markov, test)
    assert ours.top1[1] > theirs.top1[1] + 0.03
    assert ours.top1[2] > theirs.top1[2] + 0.03
    assert ours.infer_cpu_ms < 1.0


# ---------------------------------------------------------------- engagement: agents a forecaster knows


def test_a_forecaster_counts_the_agents_it_knows_and_names_loudly_those_it_does_not(caplog):
    from agentcache.policy import make_policy
    from agentcache.tags import Tags

    graph = {"planner": ["coder"], "coder": []}
    static = PredictorSpec.parse("static").build(graph, call_graph_source="the call graph g.json")
    policies = {
        "static": make_policy("pbkv", predictor=static),
        "call graph": make_policy("kvflow", call_graph=graph, call_graph_source="the call graph g.json"),
    }
    for forecaster, policy in policies.items():
        caplog.clear()
        policy.on_request(Tags(workflow="w", agent="a:1", agent_name="planner"), 0.0)
        policy.on_request(Tags(workflow="w", agent="a:2", agent_name="Researcher"), 1.0)
        policy.on_request(Tags(workflow="w", agent="a:2", agent_name="Researcher"), 2.0)
        coverage = policy.forecast_stats()[forecaster]
        assert coverage["known_agent"] == 1 and coverage["unknown_agent"] == 2, coverage
        assert coverage["unknown_agents"] == ["Researcher"] and coverage["source"] == "the call graph g.json"
        warnings = [r.getMessage() for r in caplog.records if "does not know the live agent" in r.getMessage()]
        assert len(warnings) == 1, "once per unknown agent"
        assert "the call graph g.json does not know the live agent 'Researcher'" in warnings[0]
        assert "It knows 2 agents: coder, planner" in warnings[0]


def test_pbkvs_default_forecaster_knows_the_last_round_of_a_loop_that_stops_after_three():
    """A coder/tester loop that always runs three rounds: the last three agents look the same after the second
    round and after the third, so only a longer memory knows that the workflow ends now."""
    policy = PBKVPolicy()
    rounds = ["planner"] + ["coder", "tester"] * 3
    for _ in range(20):
        for k, agent in enumerate(rounds):
            policy.predictor.observe(rounds[:k], agent)
        policy.predictor.observe(rounds, END)
    after_two, after_three = policy.predictor.predict(rounds[:5]), policy.predictor.predict(rounds)
    assert after_two[0]["coder"] > 0.8, "after two rounds the loop goes on"
    assert after_three[0][END] > 0.8, "after the third it ends"


def test_an_online_forecaster_learns_new_agents_without_a_warning(caplog):
    from agentcache.policy import make_policy
    from agentcache.tags import Tags

    policy = make_policy("pbkv")
    for i, agent in enumerate(["planner", "coder", "planner", "coder"]):
        policy.on_request(Tags(workflow="w", agent=f"a:{agent}", agent_name=agent), float(i))
    coverage = policy.forecast_stats()[f"markov-{DEFAULT_ORDER}"]
    assert coverage["known_agent"] == 4 and coverage["unknown_agent"] == 0, "it learns each agent before forecasting"
    assert "does not know" not in caplog.text
