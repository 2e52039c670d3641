"""`agentcache bench --client-form`: the same workload in other clients' forms, each ending its workflows its way."""

from __future__ import annotations

import asyncio
import json

import pytest

from agentcache.bench.forms import FORMS, OURS, Ending, parse_forms, run_label
from agentcache.bench.workload import Lifecycle, TokenMaker, Workload
from agentcache.cli import main
from agentcache.trace import End
from agentcache.workloads import GenConfig, generate


def _session_of(form: str, headers: dict[str, str], body: dict) -> tuple[str | None, str | None, bool]:
    """(workflow, agent, final) as this test reads each form back (the server's reader is agentcache/client_hints)."""
    hints = body.get("agent_hints") or {}
    context = (body.get("nvext") or {}).get("agent_context") or {}
    tags = body["sampling_params"].get("custom_params", {}).get("agentcache", {})
    workflow = {
        OURS: tags.get("workflow"),
        "sglang-session": body.get("session_id"),
        "agent-hints": hints.get("workflow_id"),
        "dynamo": headers.get("x-dynamo-session-id"),
        "dynamo-nvext": context.get("session_id"),
        "claude-code": headers.get("x-claude-code-session-id"),
        "codex": headers.get("session-id"),
        "opencode": headers.get("x-session-id"),
        "routing-key": headers.get("x-smg-routing-key"),
        "prompt-cache-key": body.get("prompt_cache_key"),
    }[form]
    agent = tags.get("agent") or hints.get("agent_id") or headers.get("x-claude-code-agent-id")
    final = headers.get("x-dynamo-session-final") == "true" or context.get("session_final") is True
    return workflow, agent, final


@pytest.mark.parametrize("form", list(FORMS))
def test_each_form_names_every_request_and_ends_each_workflow_its_way(form, recording_server_with_headers):
    url, heard = recording_server_with_headers
    trace = generate("code-retry", GenConfig(workflows=3, seed=1))
    workload = Workload(trace, TokenMaker(675, 0.05), time_scale=0.0, max_new_tokens=1)
    sent, _ = asyncio.run(workload.drive(url, {}, lifecycle=Lifecycle.PLUGIN, form=FORMS[form]))
    generated = [(h, b) for path, h, b in heard if path == "/generate"]
    assert len(sent) == len(generated) == len(trace.requests)

    read = [_session_of(form, h, b) for h, b in generated]
    by_workflow: dict[str, list] = {}
    for workflow, agent, final in read:
        by_workflow.setdefault(workflow, []).append((agent, final))
    assert {w for w, _, _ in read} == {r.workflow for r in trace.requests}, "every request names its workflow"
    assert sorted(len(v) for v in by_workflow.values()) == sorted(
        sum(r.workflow == w for r in trace.requests) for w in by_workflow
    )
    if form in (OURS, "sglang-session", "agent-hints", "claude-code"):
        assert {a for _, a, _ in read} == {r.agent for r in trace.requests}, "the form carries the agent"
    if form != OURS:
        assert all("custom_params" not in b["sampling_params"] for _, b in generated), "no tags of ours"

    ended = {e.workflow for e in trace.events if isinstance(e, End)}
    assert ended, "the trace ends its workflows"
    ending = FORMS[form].ending
    finals = {w for w, a, f in read if f}
    assert finals == (ended if ending is Ending.FINAL else set())
    if ending is Ending.FINAL:  # the final mark on each ended workflow's last request alone
        for w in ended:
            assert [f for _, f in by_workflow[w]] == [False] * (len(by_workflow[w]) - 1) + [True]
    others = sorted((path, json.dumps(body)) for path, _, body in heard if path != "/generate")
    if ending is Ending.ROUTE:
        assert [p for p, _ in others] == sorted(f"/agentcache/v1/workflows/{w}/end" for w in ended)
    elif ending is Ending.CLOSE_SESSION:
        assert others == sorted(("/close_session", json.dumps({"session_id": w})) for w in ended)
    else:
        assert others == [], "the final request or the lease ends it: nothing else is sent"


def test_forms_are_parsed_and_named_and_plain_sglang_runs_keep_ours(monkeypatch, capsys):
    assert [f.name for f in parse_forms("ours, dynamo,ours")] == [OURS, "dynamo"]
    with pytest.raises(ValueError, match="unknown client form nosuch"):
        parse_forms("dynamo,nosuch")
    assert run_label("pbkv", FORMS[OURS]) == "pbkv" and run_label("pbkv", FORMS["dynamo"]) == "pbkv via dynamo"
    assert main(["bench", "--client-form", "nosuch", "--port", "1"]) == 2
    assert "--client-form: unknown client form nosuch" in capsys.readouterr().err

    # The runs a bench makes: the plugin's in every form, plain SGLang's once, alternating over repetitions.
    from agentcache.bench import runner
    from agentcache.bench.runner import BenchOptions, measure
    from agentcache.policy import PolicySpec

    class NoServer:
        def __init__(self, opts):
            self.base_url = "http://stand-in"

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return None

        def auth_headers(self):
            return {}

    import agentcache.server_ext.launcher as launcher

    monkeypatch.setattr(launcher, "Server", NoServer)
    monkeypatch.setattr(runner, "warm_up", lambda *a: None)
    monkeypatch.setattr(runner, "server_stats", lambda *a: {})
    calls = []

    def run_workload(base_url, headers, spec, form=FORMS[OURS]):
        calls.append((spec.text, form.name))
        return [], 1.0

    opts = BenchOptions(
        policies=(PolicySpec.parse("lru"), PolicySpec.parse("pbkv")), repeat=2, forms=parse_forms("ours,dynamo")
    )
    runs = measure(opts, run_workload, capacity=100, vocab_size=100, warmup_tokens=1)
    assert [r.policy for r in runs] == ["lru", "pbkv", "pbkv via dynamo", "pbkv via dynamo", "pbkv", "lru"]
    assert calls == [
        ("lru", OURS),
        ("pbkv", OURS),
        ("pbkv", "dynamo"),
        ("pbkv", "dynamo"),
        ("pbkv", OURS),
        ("lru", OURS),
    ]


def test_the_warm_up_asks_again_while_sglang_says_a_request_is_still_running():
    """SGLang answered the warm-up's last request before its scheduler let it go, and refused /flush_cache (400,
    "Cache not flushed because there are pending requests"): the bench stopped with that 400."""
    import httpx

    from agentcache.bench.runner import flush_cache

    answers = iter([400, 400, 200])
    seen = []

    def flush(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.path)
        return httpx.Response(next(answers))

    with httpx.Client(base_url="http://server", transport=httpx.MockTransport(flush)) as client:
        flush_cache(client)
        assert seen == ["/flush_cache"] * 3
        answers = iter([400] * 100)
        with pytest.raises(httpx.HTTPStatusError):
            flush_cache(client, wait_s=0.2)


def test_the_client_forms_page_is_its_figures():
    """docs/results/client-forms.md is what benchmarks/client_forms.py writes from the JSON beside it, with our
    run and one per form that ends its workflows."""
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(root / "benchmarks"))
    import client_forms
    from pages import unstamped

    saved = json.loads((root / "docs/results/client-forms.json").read_text())
    page, made = unstamped((root / "docs/results/client-forms.md").read_text())
    assert client_forms.markdown(saved) == page
    assert made == {"command": saved["command"], "commit": saved["commit"]}
    assert list(saved["policies"]) == [run_label("pbkv", f) for f in parse_forms(client_forms.FORMS)]
    assert all(FORMS[f].ending is not Ending.LEASE for f in client_forms.FORMS.split(","))
