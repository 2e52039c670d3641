"""Writes a crash cannot tear (issue 55, case 9): models written whole, recordings never truncated unasked, a
trace whose writer stopped mid-line still readable."""

from __future__ import annotations

import json
import os

import pytest

from agentcache.atomic import atomic_write
from agentcache.trace import (
    End,
    Meta,
    Request,
    Segment,
    TornTraceWarning,
    Trace,
    TraceError,
    TraceWriter,
    read_trace,
    write_trace,
)


def request(ts: float, workflow: str = "w") -> Request:
    return Request(ts, workflow, "a", (Segment("sys", 10), Segment(f"q{ts}", 5)), 1, 3)


class Killed(BaseException):
    """Stands for the process dying mid-write (BaseException: no handler in the writer takes it)."""


def test_an_atomic_write_killed_midway_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "model.pt"
    path.write_bytes(b"old model")
    os.chmod(path, 0o640)
    with pytest.raises(Killed), atomic_write(path, "wb") as fh:
        fh.write(b"half of a new")
        raise Killed
    assert path.read_bytes() == b"old model" and os.listdir(tmp_path) == ["model.pt"]
    with atomic_write(path, "wb") as fh:
        fh.write(b"new model")
    assert path.read_bytes() == b"new model" and os.listdir(tmp_path) == ["model.pt"]
    assert os.stat(path).st_mode & 0o777 == 0o640, "the file replaced keeps its permissions"


def test_a_neural_model_killed_mid_save_leaves_the_previous_model_loadable(tmp_path, monkeypatch):
    """Before, `torch.save` wrote the model file in place: a kill mid-write left a file that no longer loaded,
    and a server started with `--agentcache-predictor neural:MODEL.pt` failed to start."""
    torch = pytest.importorskip("torch")
    from agentcache.predictor.neural import NeuralConfig, NeuralPredictor

    def model(agents: list[str]) -> NeuralPredictor:
        n = len(agents) + 3  # with PAD, UNK and START
        return NeuralPredictor(agents, torch.zeros(n, n), config=NeuralConfig(dim=16, heads=2, mlp_hidden=64))

    path = tmp_path / "model.pt"
    model(["a", "b"]).save(path)
    save = torch.save

    def killed_mid_write(obj, fh, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        save(obj, fh, *args, **kwargs)
        fh.truncate(fh.tell() // 2)
        raise Killed

    monkeypatch.setattr(torch, "save", killed_mid_write)
    with pytest.raises(Killed):
        model(["a", "b", "c"]).save(path)
    assert NeuralPredictor.load(path).agents == ["a", "b"], "the previous model, whole"
    assert os.listdir(tmp_path) == ["model.pt"]


def test_a_trace_writer_never_truncates_a_recording_unasked_and_appends_when_asked(tmp_path):
    """Before, `TraceWriter(path)` opened the file with "w": a second recording into the same file silently wiped
    the first. Now it is refused; `append=True` adds events after the recording's own, validated with them."""
    path = tmp_path / "rec.jsonl"
    with TraceWriter(path, Meta(name="first")) as writer:
        writer.write(request(1.0))
    before = path.read_text()
    with pytest.raises(FileExistsError, match="rec.jsonl: a trace is there already"):
        TraceWriter(path, Meta(name="second"))
    assert path.read_text() == before

    with TraceWriter(path, Meta(name="second"), append=True) as writer:
        assert writer.last_ts == 1.0
        with pytest.raises(TraceError, match="timestamps must not decrease"):
            writer.write(request(0.5))
        writer.write(request(2.0))
        writer.write(End(3.0, "w"))
    trace = read_trace(path)
    assert trace.meta.name == "first" and [r.ts for r in trace.requests] == [1.0, 2.0]
    assert trace.ended_workflows == {"w"}

    empty = tmp_path / "empty.jsonl"
    empty.touch()
    with TraceWriter(empty, Meta(name="new")) as writer:  # an empty file holds no recording
        writer.write(request(0.0))
    assert read_trace(empty).meta.name == "new"


def test_the_sdk_recorder_refuses_an_existing_recording_and_appends_after_its_time(tmp_path):
    import agentcache_sdk as ac
    from agentcache.tags import Tags

    path = tmp_path / "rec.jsonl"
    write_trace(path, Trace(Meta(name="earlier"), [request(5.0)]))
    with pytest.raises(FileExistsError):
        ac.record(path)
    with ac.record(path, append=True) as recorder:
        recorder.on_request(0.0, {"messages": [{"role": "system", "content": "s"}]}, {}, Tags(workflow="w2", agent="a"))
    requests = read_trace(path).requests
    assert [r.workflow for r in requests] == ["w", "w2"] and requests[1].ts >= 5.0


def test_a_torn_last_line_is_left_out_with_a_warning_naming_file_and_line(tmp_path):
    """Before, a recorder killed mid-line left a trace that `read_trace` refused whole (`not valid JSON`)."""
    path = tmp_path / "t.jsonl"
    write_trace(path, Trace(Meta(name="t"), [request(1.0), request(2.0)]))
    whole = path.read_text()
    path.write_text(whole + json.dumps(request(3.0).to_json())[:25])
    with pytest.warns(TornTraceWarning, match=f"{path}:4: the last line is cut short"):
        trace = read_trace(path)
    assert [r.ts for r in trace.requests] == [1.0, 2.0]

    with pytest.raises(TraceError, match="the last line is cut short; remove it to append"):
        TraceWriter(path, append=True)


@pytest.mark.parametrize(
    ("tail", "says"),
    [
        ('{"type": "request", "ts": 3\n', ":4: not valid JSON"),  # a whole line (its newline written), malformed
        ('{"type": "end", "ts": 3, "workflow": "w"}', None),  # the last line whole, with no newline: read
    ],
)
def test_anything_but_a_torn_last_line_is_read_or_refused_as_before(tmp_path, tail, says):
    path = tmp_path / "t.jsonl"
    write_trace(path, Trace(Meta(name="t"), [request(1.0), request(2.0)]))
    path.write_text(path.read_text() + tail)
    if says is None:
        assert read_trace(path).ended_workflows == {"w"}
        return
    with pytest.raises(TraceError, match=says):
        read_trace(path)
    path.write_text(path.read_text().replace('"ts": 2.0', '"ts": 2.0,,', 1))  # a malformed line mid-file
    with pytest.raises(TraceError, match=":3: not valid JSON"):
        read_trace(path)


def test_write_trace_replaces_a_file_whole_or_not_at_all(tmp_path):
    path = tmp_path / "t.jsonl"
    write_trace(path, Trace(Meta(name="old"), [request(1.0)]))
    bad = Trace(Meta(name="new"), [request(2.0), request(1.0)])  # time runs backwards: refused midway
    with pytest.raises(TraceError):
        write_trace(path, bad)
    assert read_trace(path).meta.name == "old" and os.listdir(tmp_path) == ["t.jsonl"]
