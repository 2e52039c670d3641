import io
import json

import pytest

from agentcache.trace import (
    EVENT_GROUPS,
    AgentDone,
    End,
    EventFieldError,
    Meta,
    Next,
    Plan,
    Request,
    Segment,
    ToolEnd,
    ToolStart,
    Trace,
    TraceError,
    TraceWriter,
    UnknownEventsWarning,
    iter_trace,
    next_fields,
    plan_fields,
    read_trace,
    write_trace,
)

GOOD_REQUEST = {
    "type": "request",
    "ts": 1.0,
    "workflow": "wf-1",
    "agent": "coder",
    "segments": [["sys/coder", 100], ["task/1", 20]],
    "fixed": 1,
    "output": 10,
    "output_id": "out/1",
}


def lines(*objs):
    return [json.dumps(o) if isinstance(o, dict) else o for o in objs]


def parse(*objs):
    return list(iter_trace(lines(*objs), "t.jsonl"))


def error_of(*objs) -> TraceError:
    with pytest.raises(TraceError) as info:
        parse(*objs)
    return info.value


def test_reads_meta_requests_and_ends():
    meta = {"type": "meta", "version": 1, "name": "x", "call_graph": {"a": ["b"]}, "extra": 5}
    items = parse(meta, GOOD_REQUEST, {"type": "end", "ts": 2, "workflow": "wf-1"})
    assert isinstance(items[0], Meta) and items[0].call_graph == {"a": ["b"]} and items[0].extra == {"extra": 5}
    req = items[1]
    assert isinstance(req, Request)
    assert req.segments == (Segment("sys/coder", 100), Segment("task/1", 20))
    assert req.prompt_tokens == 120 and req.fixed_tokens == 100
    assert items[2] == End(2.0, "wf-1")


def test_unknown_fields_are_ignored():
    (req,) = parse({**GOOD_REQUEST, "future_field": [1, 2]})
    assert req.workflow == "wf-1"


@pytest.mark.parametrize(
    "change, field, fragment",
    [
        ({"ts": -1}, "ts", ">= 0"),
        ({"ts": "soon"}, "ts", "finite number"),
        ({"workflow": ""}, "workflow", "non-empty string"),
        ({"agent": 3}, "agent", "non-empty string"),
        ({"segments": []}, "segments", "non-empty list"),
        ({"segments": [["a", 0]]}, "segments[0][1]", ">= 1"),
        ({"segments": [["a", 1.5]]}, "segments[0][1]", "integer"),
        ({"segments": [["a", True]]}, "segments[0][1]", "integer"),
        ({"segments": [[5, 3]]}, "segments[0][0]", "content id"),
        ({"segments": [["a", 3, 4]]}, "segments[0]", "[content_id, tokens]"),
        ({"fixed": 3}, "fixed", "only 2"),
        ({"fixed": -1}, "fixed", ">= 0"),
        ({"output": 0}, "output", ">= 1"),
        ({"output_id": 7}, "output_id", "non-empty string"),
        ({"prompt_hidden": [1, "x"]}, "prompt_hidden", "finite numbers"),
        ({"type": 5}, "type", "an event type"),
        ({"type": ""}, "type", "an event type"),
    ],
)
def test_malformed_request_names_line_and_field(change, field, fragment):
    err = error_of({"type": "meta", "version": 1}, {**GOOD_REQUEST, **change})
    assert err.line == 2 and err.field == field and err.source == "t.jsonl"
    assert fragment in str(err) and str(err).startswith("t.jsonl:2: field")


def test_bad_json_and_non_objects():
    assert "not valid JSON" in str(error_of("{oops"))
    assert "expected a JSON object" in str(error_of("[1, 2]"))


def test_cross_line_rules():
    later = {**GOOD_REQUEST, "ts": 0.5}
    assert "must not decrease" in str(error_of(GOOD_REQUEST, later))
    clash = {**GOOD_REQUEST, "ts": 2, "segments": [["sys/coder", 99]]}
    err = error_of(GOOD_REQUEST, clash)
    assert err.line == 2 and "but 100 on line 1" in str(err)
    reused_output = {**GOOD_REQUEST, "ts": 2, "segments": [["out/1", 11]], "fixed": 0, "output_id": "out/2"}
    assert "out/1" in str(error_of(GOOD_REQUEST, reused_output))
    end = {"type": "end", "ts": 3, "workflow": "wf-1"}
    assert "after its end event on line 2" in str(error_of(GOOD_REQUEST, end, {**GOOD_REQUEST, "ts": 4}))
    assert "already ended" in str(error_of(GOOD_REQUEST, end, end))
    assert "only be the first line" in str(error_of(GOOD_REQUEST, {"type": "meta", "version": 1}))
    assert "version" in str(error_of({"type": "meta", "version": 2}))


def test_round_trip(tmp_path):
    trace = Trace(
        Meta(name="demo", call_graph={"a": ["b"]}),
        [
            Request(
                0.0, "w", "a", (Segment("s", 5), Segment("t", 2)), 1, 3, "o1", app="app", prompt_hidden=(0.5, -1.0)
            ),
            Request(1.0, "w", "b", (Segment("s2", 4), Segment("t", 2), Segment("o1", 3)), 1, 2),
            End(2.0, "w"),
        ],
    )
    path = tmp_path / "t.jsonl"
    write_trace(path, trace)
    again = read_trace(path)
    assert again.events == trace.events and again.meta.call_graph == {"a": ["b"]} and again.meta.name == "demo"


def test_writer_refuses_what_the_reader_would_refuse():
    buf = io.StringIO()
    writer = TraceWriter(buf)
    writer.write(Request(1.0, "w", "a", (Segment("s", 5),), 1, 3))
    with pytest.raises(TraceError):
        writer.write(Request(0.5, "w", "a", (Segment("s", 5),), 1, 3))  # time went backwards
    assert buf.getvalue().count("\n") == 1  # the bad event was not written


def test_real_traces_are_valid(tmp_path):
    from pathlib import Path

    real = Path(__file__).resolve().parents[1] / "benchmarks" / "traces"
    files = sorted(real.glob("*.jsonl"))
    assert files, "the real traces are bundled under benchmarks/traces"
    for f in files:
        assert read_trace(f).requests


# ---------------------------------------------------------------- event types: unknown ones, tool calls

TOOL_START = {"type": "tool_start", "ts": 1.5, "workflow": "wf-1", "agent": "coder", "tool": "run_tests"}
TOOL_END = {**TOOL_START, "type": "tool_end", "ts": 9.0}


def test_unknown_event_types_are_left_out_and_counted_never_refused(tmp_path):
    newer = [
        {"type": "meta", "version": 1},
        GOOD_REQUEST,
        {"type": "handoff", "ts": 2, "workflow": "wf-1", "to": ["tester"]},
        {"type": "hologram", "anything": [1, {"x": 2}]},
        {"type": "handoff", "ts": 3, "workflow": "wf-1", "to": ["coder"]},
        {"type": "end", "ts": 4, "workflow": "wf-1"},
    ]
    with pytest.warns(UnknownEventsWarning) as caught:
        items = parse(*newer)
    assert [type(i) for i in items] == [Meta, Request, End]
    (warning,) = caught
    assert str(warning.message) == (
        "t.jsonl: 3 events of types this reader does not know left out: 'handoff' x2 (first on line 3),"
        " 'hologram' x1 (first on line 4)"
    )
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(o) + "\n" for o in newer))
    with pytest.warns(UnknownEventsWarning, match="3 events"):
        trace = read_trace(path)
    assert trace.skipped == {"handoff": 2, "hologram": 1} and len(trace.events) == 2


def test_a_line_of_unknown_type_must_still_be_a_json_object_with_a_type():
    assert "not valid JSON" in str(error_of(GOOD_REQUEST, "{oops"))
    err = error_of(GOOD_REQUEST, {"ts": 2, "workflow": "wf-1"})
    assert err.line == 2 and err.field == "type" and "an event type" in str(err)


def test_tool_events_are_read_validated_and_written(tmp_path):
    items = parse(GOOD_REQUEST, TOOL_START, TOOL_END, {"type": "end", "ts": 9.5, "workflow": "wf-1"})
    assert items[1:3] == [ToolStart(1.5, "wf-1", "coder", "run_tests"), ToolEnd(9.0, "wf-1", "coder", "run_tests")]
    trace = Trace(Meta(name="tools"), items)
    path = tmp_path / "t.jsonl"
    write_trace(path, trace)
    assert read_trace(path).events == items
    assert [json.loads(line) for line in path.read_text().splitlines()[2:4]] == [TOOL_START, TOOL_END]


@pytest.mark.parametrize(
    "change, field, fragment",
    [
        ({"tool": ""}, "tool", "non-empty string"),
        ({"tool": None}, "tool", "non-empty string"),
        ({"tool": "x" * 257}, "tool", "at most 256"),
        ({"agent": 7}, "agent", "non-empty string"),
        ({"workflow": "a\nb"}, "workflow", "non-printable"),
        ({"ts": "later"}, "ts", "finite number"),
        ({"ts": 0.5}, "ts", "must not decrease"),
    ],
)
def test_malformed_tool_events_name_line_and_field(change, field, fragment):
    for event in (TOOL_START, TOOL_END):
        err = error_of({"type": "meta", "version": 1}, GOOD_REQUEST, {**event, **change})
        assert err.line == 3 and err.field == field and fragment in str(err), str(err)
        assert str(err).startswith("t.jsonl:3: field")


def test_a_tool_event_after_its_workflows_end_is_refused():
    end = {"type": "end", "ts": 1.0, "workflow": "wf-1"}
    err = error_of(GOOD_REQUEST, end, TOOL_START)
    assert err.line == 3 and "tool_start for workflow 'wf-1' after its end event on line 2" in str(err)


# ---------------------------------------------------------------- what the framework knows: next, agent_done, plan

NEXT = {"type": "next", "ts": 2.0, "workflow": "wf-1", "agents": ["tester", "reviewer"]}
DONE = {"type": "agent_done", "ts": 2.5, "workflow": "wf-1", "agent": "coder"}
PLAN = {
    "graph": {"planner": ["coder"], "coder": ["tester"], "tester": ["coder", "reviewer"], "reviewer": []},
    "order": ["planner", "coder"],
    "max_turns": 12,
    "chain": [["draft", ["planner", "coder"]], ["check", ["tester"]]],
}


def test_next_agent_done_and_the_plan_are_read_validated_and_written(tmp_path):
    meta = {"type": "meta", "version": 1, "name": "x", "plan": PLAN}
    items = parse(meta, GOOD_REQUEST, NEXT, DONE, {"type": "end", "ts": 3, "workflow": "wf-1"})
    assert items[0].plan == Plan(
        graph={"planner": ("coder",), "coder": ("tester",), "tester": ("coder", "reviewer"), "reviewer": ()},
        order=("planner", "coder"),
        max_turns=12,
        chain=(("draft", ("planner", "coder")), ("check", ("tester",))),
    )
    assert items[0].plan.agents == {"planner", "coder", "tester", "reviewer"} and items[0].extra == {}
    assert items[2:4] == [Next(2.0, "wf-1", ("tester", "reviewer")), AgentDone(2.5, "wf-1", "coder")]
    path = tmp_path / "t.jsonl"
    write_trace(path, Trace(items[0], items[1:]))
    again = read_trace(path)
    assert again.meta.plan == items[0].plan and again.events == items[1:]
    written = [json.loads(line) for line in path.read_text().splitlines()]
    assert written[0]["plan"] == PLAN and written[2:4] == [NEXT, DONE]


def test_a_plan_may_hold_any_subset_of_its_keys_and_other_keys_are_ignored():
    assert plan_fields({}) == Plan()
    assert plan_fields({"max_turns": 3, "later": {"x": 1}}) == Plan(max_turns=3)
    assert Plan(order=("a",)).to_json() == {"order": ["a"]}


def test_ignoring_next_and_plan_leaves_the_events_and_the_meta_plan_out():
    meta = Meta(name="x", plan=Plan(max_turns=4))
    trace = Trace(
        meta, [Request(1.0, "w", "a", (Segment("s", 1),), 0, 1), Next(2.0, "w", ("a",)), AgentDone(3.0, "w", "a")]
    )
    assert set(EVENT_GROUPS) >= {"tool", "next", "plan"}
    assert trace.without(["next"]).events == trace.events[:1] and trace.without(["next"]).meta.plan == Plan(max_turns=4)
    plain = trace.without(["plan"])
    assert plain.meta.plan is None and plain.events == trace.events and trace.meta.plan == Plan(max_turns=4)


@pytest.mark.parametrize(
    "event, change, field, fragment",
    [
        (NEXT, {"agents": []}, "agents", "1 to 16"),
        (NEXT, {"agents": "tester"}, "agents", "list of 1 to 16"),
        (NEXT, {"agents": [f"a{i}" for i in range(17)]}, "agents", "1 to 16"),
        (NEXT, {"agents": ["a", "a"]}, "agents", "twice"),
        (NEXT, {"agents": ["a", ""]}, "agents", "item 1"),
        (NEXT, {"workflow": None}, "workflow", "non-empty string"),
        (NEXT, {"ts": 0.5}, "ts", "must not decrease"),
        (DONE, {"agent": "x" * 257}, "agent", "at most 256"),
        (DONE, {"workflow": "a\nb"}, "workflow", "non-printable"),
    ],
)
def test_malformed_next_and_agent_done_events_name_line_and_field(event, change, field, fragment):
    err = error_of({"type": "meta", "version": 1}, GOOD_REQUEST, {**event, **change})
    assert err.line == 3 and err.field == field and fragment in str(err), str(err)


@pytest.mark.parametrize(
    "plan, field, fragment",
    [
        ([], "plan", "must be an object"),
        ({"graph": ["a"]}, "plan.graph", "object mapping"),
        ({"graph": {"a": "b"}}, "plan.graph", "to a list"),
        ({"graph": {"a": [""]}}, "plan.graph", "non-empty string"),
        ({"order": []}, "plan.order", "1 to 256"),
        ({"max_turns": 0}, "plan.max_turns", ">= 1"),
        ({"max_turns": True}, "plan.max_turns", "integer"),
        ({"chain": [["p"]]}, "plan.chain", "[phase, [agents]]"),
        ({"chain": [["p", []]]}, "plan.chain", "1 to 256"),
        ({"order": [f"a{i}" for i in range(257)]}, "plan.order", "1 to 256"),
        ({"graph": {f"a{i}": [] for i in range(257)}}, "plan", "257 agents"),
        ({"graph": {"a": ["b" * 200] * 400}}, "plan", "at most 65536"),
    ],
)
def test_a_malformed_plan_names_its_field(plan, field, fragment):
    with pytest.raises(EventFieldError) as info:
        plan_fields(plan)
    assert info.value.field == field and info.value.reason == f"bad_{field}" and fragment in str(info.value)
    err = error_of({"type": "meta", "version": 1, "plan": plan}, GOOD_REQUEST)
    assert err.line == 1 and err.field == field


def test_next_fields_is_the_one_check_the_server_shares():
    assert next_fields({"workflow": "w", "agents": ["a", "b"], "extra": 1}) == ("w", ("a", "b"))
    with pytest.raises(EventFieldError) as info:
        next_fields({"workflow": "w"})
    assert info.value.field == "agents"


def test_a_next_or_agent_done_after_its_workflows_end_is_refused():
    end = {"type": "end", "ts": 1.0, "workflow": "wf-1"}
    err = error_of(GOOD_REQUEST, end, NEXT)
    assert err.line == 3 and "next for workflow 'wf-1' after its end event on line 2" in str(err)
    err = error_of(GOOD_REQUEST, end, DONE)
    assert "agent_done for workflow 'wf-1' after its end event" in str(err)


def test_requests_may_name_their_app():
    (req,) = parse({**GOOD_REQUEST, "app": "support-bot"})
    assert req.app == "support-bot" and req.to_json()["app"] == "support-bot"
