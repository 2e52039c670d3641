"""`agentcache bench` refuses what it cannot run before it starts any server, saying where and what."""

from __future__ import annotations

import pytest

from agentcache.cli import main
from agentcache.trace import write_trace
from agentcache.workloads import GenConfig, generate


@pytest.fixture
def good_trace(tmp_path):
    path = tmp_path / "good.jsonl"
    write_trace(path, generate("group-chat", GenConfig(workflows=2, seed=1)))
    return path


def test_a_trace_with_a_broken_line_is_named_with_its_line(tmp_path, good_trace, capsys):
    lines = good_trace.read_text().splitlines()
    lines[3] = '{"type": "request", "ts": '  # cut off mid-record
    broken = tmp_path / "broken.jsonl"
    broken.write_text("\n".join(lines) + "\n")
    assert main(["bench", str(broken), "--port", "1"]) == 2
    out = capsys.readouterr().err
    assert "broken.jsonl:4: not valid JSON" in out


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--repeat", "2"], "--repeat must be >= 3"),
        (["--policy", "lru,nosuch"], "--policy"),
        (["--policy", "belady"], "cannot run live"),
        (["--policy", "session-lfu+prefetch"], "prefetching works with pbkv policies only"),
        (["--time-scale", "0"], "--time-scale must be > 0"),
        (["--workflows", "0"], "--workflows must be >= 1"),
    ],
)
def test_bad_options_are_refused_clearly(good_trace, capsys, args, says):
    assert main(["bench", str(good_trace), *args]) == 2
    assert says in capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--family", "nosuch"], "invalid choice: 'nosuch'"),
        (["TRACE", "--family", "chat"], "not allowed with argument trace"),
    ],
)
def test_a_generated_family_is_checked_and_excludes_a_trace(good_trace, capsys, args, says):
    with pytest.raises(SystemExit) as exited:
        main(["bench", *[str(good_trace) if a == "TRACE" else a for a in args]])
    assert exited.value.code == 2
    assert says in capsys.readouterr().err


def test_a_missing_trace_file_is_named(tmp_path, capsys):
    assert main(["bench", str(tmp_path / "absent.jsonl")]) == 2
    assert "absent.jsonl" in capsys.readouterr().err


def test_the_json_contract_keys_are_documented_in_the_help(capsys):
    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    text = capsys.readouterr().out
    for key in ("hit_rate", "computed_prompt_tokens", "runs", "ttft_s", "latency_s", "makespan_s"):
        assert key in text


def test_bench_servers_run_one_engine_thread_on_cpu():
    """One torch thread per CPU engine: with one per core a busy neighbour process made single runs 15x slower."""
    from agentcache.bench.runner import ENGINE_CPU_THREADS, BenchOptions, serve_options
    from agentcache.policy import PolicySpec
    from agentcache.server_ext.launcher import sglang_command

    for policy in ("lru", "pbkv"):
        opts = serve_options(PolicySpec.parse(policy), BenchOptions(cpu=True), 8000, "run")
        _, env = sglang_command(opts, "/models/m")
        assert env["OMP_NUM_THREADS"] == str(ENGINE_CPU_THREADS) == "1"


@pytest.mark.parametrize(
    ("policy", "flags", "lifecycle"),
    [
        ("lru", ["--radix-eviction-policy", "lru"], "none"),
        ("lfu", ["--radix-eviction-policy", "lfu"], "none"),
        ("session-lru", ["--radix-eviction-policy", "lru", "--enable-session-radix-cache"], "sessions"),
        ("session-lfu", ["--radix-eviction-policy", "lfu", "--enable-session-radix-cache"], "sessions"),
        ("pbkv", ["--radix-cache-backend", "agentcache", "--agentcache-policy", "pbkv"], "plugin"),
    ],
)
def test_sglangs_session_cache_runs_live_on_plain_sglang_with_its_flag(policy, flags, lifecycle):
    """session-lru / session-lfu are a plain SGLang server with --enable-session-radix-cache over the strategy (no
    plugin), and the workload speaks sessions to it (session_id, /close_session); the live commands took them."""
    from agentcache.bench.runner import BenchOptions, lifecycle_of, live_refusal, runs_on_plain_sglang, serve_options
    from agentcache.policy import PolicySpec
    from agentcache.server_ext.launcher import NO_PLUGINS, sglang_command

    spec = PolicySpec.parse(policy)
    cmd, env = sglang_command(serve_options(spec, BenchOptions(cpu=True), 8000, "run"), "/models/m")
    assert " ".join(flags) in " ".join(cmd)
    assert ("--enable-session-radix-cache" in cmd) == spec.sessions
    assert runs_on_plain_sglang(spec) == (env.get("SGLANG_PLUGINS") == NO_PLUGINS) == (policy != "pbkv")
    assert lifecycle_of(spec).value == lifecycle
    assert live_refusal(spec) is None


def test_every_best_of_sglangs_strategies_includes_its_session_caches():
    from agentcache.bench.report import comparisons
    from agentcache.bench.runner import best_sglang_strategy
    from agentcache.bench.runs import Run
    from agentcache.bench.workload import Sent

    def run(policy, repetition, cached):
        return Run(policy, repetition, [Sent(0.1, 0.5, 100, cached)] * 4, 10.0)

    hits = {"lru": 50, "lfu": 55, "session-lfu": 60, "pbkv": 65}
    runs = [run(p, r, hits[p]) for r in range(3) for p in hits]
    assert best_sglang_strategy(runs) == "session-lfu"
    assert best_sglang_strategy(runs, besides=("lru", "session-lfu")) == "lfu"
    lines = comparisons(runs)
    assert any(
        line.startswith("pbkv vs session-lfu: computed 0.88x the prompt tokens (fewer in 3 of 3") for line in lines
    )
    assert lines[-1] == "best of SGLang's other strategies by hit rate: session-lfu"


def test_a_generated_chat_sends_every_turn_of_its_conversations(monkeypatch):
    """`--workflows N` generates N conversations; the cut to a trace's first N workflows is for trace files only
    (a chat's turns are workflows of their own: the cut kept N single turns)."""
    import agentcache.cli.bench
    from agentcache.bench.workload import BENCH_SEED, BenchError

    sent = []

    def capture(trace, *args, **kwargs):
        sent.append(trace)
        raise BenchError("captured")

    monkeypatch.setattr(agentcache.cli.bench, "bench_trace", capture)
    assert main(["bench", "--family", "chat", "--workflows", "3", "--port", "1"]) == 2
    (trace,) = sent
    conversations = {r.workflow.rsplit("-", 1)[0] for r in trace.requests}
    assert len(conversations) == 3
    assert len(trace.requests) == len(generate("chat", GenConfig(workflows=3, seed=BENCH_SEED)).requests) > 3


def test_as_served_is_the_workload_a_bench_run_sends():
    """The replay of a bench's workload sees the prompts the bench sends (segments scaled as its tokens are
    made), the outputs as capped, and no generated output to reuse (the model writes its own)."""
    from agentcache.bench.workload import TokenMaker, as_served
    from agentcache.trace import End

    trace = generate("chat", GenConfig(workflows=3, seed=1))
    served = as_served(trace, token_scale=0.35, max_new_tokens=4)
    tokens = TokenMaker(vocab_size=32000, scale=0.35)
    assert [type(e) for e in served.events] == [type(e) for e in trace.events]
    assert sum(isinstance(e, End) for e in served.events) == sum(isinstance(e, End) for e in trace.events)
    for sent, original in zip(served.requests, trace.requests, strict=True):
        assert sent.prompt_tokens == len(tokens.prompt(original)[0]) < original.prompt_tokens
        assert [s.content_id for s in sent.segments] == [s.content_id for s in original.segments]
        assert sent.output == min(original.output, 4) and sent.output_id is None


def test_a_request_no_server_can_hold_is_refused_before_any_server_starts(tmp_path, good_trace, capsys):
    """A trace's request longer than the model's context (or than --capacity) was sent anyway: the server refused
    it, or, with a segment of 10^12 tokens, the bench died of MemoryError making its tokens."""
    from agentcache.trace import Meta, Request, Segment, Trace

    huge = tmp_path / "huge.jsonl"
    write_trace(huge, Trace(Meta(), [Request(0.0, "w", "a", (Segment("s", 10**12),), 1, 8, None)]))
    assert main(["bench", str(huge), "--model-size", "tiny"]) == 2
    err = capsys.readouterr().err.replace("\n", "")
    assert "request 0 (workflow 'w') needs 350,000,000,004 tokens at --token-scale 0.35" in err
    assert "more than the 32,768 a server here holds" in err

    assert main(["bench", str(good_trace), "--model-size", "tiny", "--capacity", "100"]) == 2
    assert "more than the 100 a server here holds" in capsys.readouterr().err.replace("\n", "")


def test_a_refused_warm_up_says_why_the_server_refused_it():
    """`agentcache demo --capacity 50` ended in "Client error '400 Bad Request' for url ..." and a link to MDN; the
    reason was in SGLang's answer ("Input length (600 tokens) exceeds the maximum allowed length (44 tokens)"),
    which is what a bench or demo run now says."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from agentcache.bench.runner import warm_up
    from agentcache.bench.workload import BenchError

    reason = {"error": {"message": "Input length (600 tokens) exceeds the maximum allowed length (44 tokens)."}}

    class Refusing(BaseHTTPRequestHandler):
        def log_message(self, *args):  # noqa: ANN002
            pass

        def do_POST(self):  # noqa: N802 - SGLang's answer to a prompt longer than it can hold
            self.rfile.read(int(self.headers["content-length"]))
            data = json.dumps(reason).encode()
            self.send_response(400)
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Refusing)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with pytest.raises(BenchError, match=r"refused a warm-up request of 600 tokens \(HTTP 400\): .*exceeds"):
            warm_up(f"http://127.0.0.1:{server.server_address[1]}", {}, 675, 600, 1)
    finally:
        server.shutdown()


@pytest.mark.parametrize(
    ("lifecycle", "session_ids", "ends"),
    [
        ("sessions", True, "/close_session"),
        ("plugin", False, "/agentcache/v1/workflows/{}/end"),
        ("none", False, None),
    ],
)
def test_the_workload_tells_each_server_where_workflows_end_its_own_way(lifecycle, session_ids, ends, recording_server):
    """SGLang's session cache: every request carries its workflow as the top-level session_id (never
    session_params, which SGLang's radix-native sessions ignore) and the workflow's End is /close_session; the
    plugin hears Ends on its route; plain SGLang hears none."""
    import asyncio

    from agentcache.bench.workload import Lifecycle, TokenMaker, Workload
    from agentcache.trace import ToolStart

    url, heard = recording_server
    trace = generate("tool-use", GenConfig(workflows=2, seed=1))  # its tool events: tests/test_tool_measures.py
    assert any(isinstance(e, ToolStart) for e in trace.events)
    workflows = {r.workflow for r in trace.requests}
    workload = Workload(trace, TokenMaker(675, 0.05), time_scale=0.0, max_new_tokens=1)
    sent, _ = asyncio.run(workload.drive(url, {}, lifecycle=Lifecycle(lifecycle)))
    generated = [body for path, body in heard if path == "/generate"]
    assert len(sent) == len(generated) == len(trace.requests)
    assert all("session_params" not in body for body in generated)
    if session_ids:
        assert {body["session_id"] for body in generated} == workflows
    else:
        assert all("session_id" not in body for body in generated)
    others = [(path, body) for path, body in heard if path not in ("/generate", "/agentcache/v1/events")]
    if ends is None:
        assert others == []
    elif lifecycle == "sessions":
        assert sorted(others, key=str) == sorted(((ends, {"session_id": w}) for w in workflows), key=str)
    else:
        assert sorted(path for path, _ in others) == sorted(ends.format(w) for w in workflows)


@pytest.mark.parametrize("lifecycle", ["plugin", "sessions"])
def test_the_workload_tells_the_plugin_its_plan_first_and_each_decision_at_its_time(lifecycle, recording_server):
    """A family generated with its framework's hints: the plugin hears the plan before any request, under the app
    every request then names, and each next and agent_done without a time, in its workflow's order; a server without
    the plugin hears none of them."""
    import asyncio

    from agentcache.bench.workload import Lifecycle, TokenMaker, Workload
    from agentcache.trace import AgentDone, Next

    url, heard = recording_server
    trace = generate("phased-chat", GenConfig(workflows=2, seed=1, hints=True))
    decisions = [e for e in trace.events if isinstance(e, (Next, AgentDone))]
    assert trace.meta.plan is not None and decisions
    workload = Workload(trace, TokenMaker(675, 0.05), time_scale=0.0, max_new_tokens=1)
    asyncio.run(workload.drive(url, {}, lifecycle=Lifecycle(lifecycle)))
    events = [event for path, body in heard if path == "/agentcache/v1/events" for event in body["events"]]
    generated = [body for path, body in heard if path == "/generate"]
    if lifecycle == "sessions":
        assert events == [] and all("app" not in str(body) for body in generated)
        return
    assert events[0] == {"type": "plan", "app": "phased-chat", "plan": trace.meta.plan.to_json()}
    assert heard[0][0] == "/agentcache/v1/events", "the plan comes before any request"
    for workflow in {e.workflow for e in decisions}:  # workflows run side by side: each one's in its order
        told = [e for e in events[1:] if e["type"] in ("next", "agent_done") and e["workflow"] == workflow]
        ts_less = [{k: v for k, v in e.to_json().items() if k != "ts"} for e in decisions if e.workflow == workflow]
        assert told == ts_less
    assert {body["sampling_params"]["custom_params"]["agentcache"]["app"] for body in generated} == {"phased-chat"}
