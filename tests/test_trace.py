import io
import json

import pytest

from agentcache.trace import (
    End,
    Meta,
    Request,
    Segment,
    ToolEnd,
    ToolStart,
    Trace,
    TraceError,
    TraceWriter,
    UnknownEventsWarning,
    iter_trace,
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
        {"type": "next", "ts": 2, "workflow": "wf-1", "agents": ["tester"]},
        {"type": "hologram", "anything": [1, {"x": 2}]},
        {"type": "next", "ts": 3, "workflow": "wf-1", "agents": ["coder"]},
        {"type": "end", "ts": 4, "workflow": "wf-1"},
    ]
    with pytest.warns(UnknownEventsWarning) as caught:
        items = parse(*newer)
    assert [type(i) for i in items] == [Meta, Request, End]
    (warning,) = caught
    assert str(warning.message) == (
        "t.jsonl: 3 events of types this reader does not know left out: 'hologram' x1 (first on line 4),"
        " 'next' x2 (first on line 3)"
    )
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(o) + "\n" for o in newer))
    with pytest.warns(UnknownEventsWarning, match="3 events"):
        trace = read_trace(path)
    assert trace.skipped == {"next": 2, "hologram": 1} and len(trace.events) == 2


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
