"""SGLang's session cache (--enable-session-radix-cache) as the session-lru / session-lfu baselines of the replay:
each workflow a session, its path registered when a request finishes, released at the workflow's end."""

from __future__ import annotations

import json
from array import array

import pytest

from agentcache.policy import WorkflowRegistry, make_policy
from agentcache.policy.spec import BUILTINS, PolicySpec
from agentcache.replay.engine import ReplayCache
from agentcache.replay.runner import PreparedTrace, build_replay_cache, replay_policy
from agentcache.replay.tokens import EncodedRequest
from agentcache.tags import Tags


def request(first: int, length: int = 30) -> EncodedRequest:
    """A request of `length` tokens of its own (prompt, then a one-token output), no fixed prompt."""
    return EncodedRequest(array("q", range(first, first + length)), length - 1, 0, ())


def _matched(cache: ReplayCache, enc: EncodedRequest) -> int:
    from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams
    from sglang.srt.mem_cache.radix_cache import RadixKey

    return cache.cache.match_prefix(MatchPrefixParams(key=RadixKey(enc.tokens[: enc.prompt_len]))).device_prefix_len


@pytest.mark.parametrize(("name", "strategy"), [("session-lru", "LRUStrategy"), ("session-lfu", "LFUStrategy")])
def test_the_session_policies_run_on_sglangs_session_cache_over_their_strategy(name, strategy, small_traces):
    from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

    spec = PolicySpec.parse(name)
    assert spec.builtin and spec.sessions and name in BUILTINS
    prepared = PreparedTrace(small_traces["code-retry"])
    cache = build_replay_cache(prepared, spec, 4000, 0, None, WorkflowRegistry(lease_s=300), lambda node: 0.0)
    assert isinstance(cache.cache, UnifiedRadixCache) and cache.cache.enable_session_radix_cache
    assert type(cache.cache.tree_core.eviction_strategy).__name__ == strategy
    assert 0 < replay_policy(prepared, spec, 4000).hit_rate <= 1


def under_pressure(end_first: bool, sessions: bool = True) -> tuple[int, int]:
    """Workflow A's request, then others' (each ended at once) until the cache must evict: how much of A's and of
    the first other's prompt is still cached. `end_first`: A ended before the others came."""
    cache = ReplayCache(100, make_policy("lru"), builtin="lru", sessions=sessions)
    a, b = request(1000), request(2000)
    cache.serve(a, Tags(workflow="A", agent="x"), 0.0)
    if end_first:
        cache.end_workflow("A", 0.5)
    for i, enc in enumerate([b, request(3000), request(4000), request(5000)]):
        cache.serve(enc, Tags(workflow=f"other{i}", agent="x"), 1.0 + i)
        cache.end_workflow(f"other{i}", 1.5 + i)
    # Only A, never ended unless asked, may hold a path.
    assert set(cache.component._session_leaves) <= ({"A"} if sessions and not end_first else set())
    return _matched(cache, a), _matched(cache, b)


def test_a_held_sessions_path_outlives_entries_no_session_holds():
    a_kept, b_kept = under_pressure(end_first=False)
    assert a_kept == 29 and b_kept == 0
    assert under_pressure(end_first=False, sessions=False) == (0, 0)  # lru alone evicts A, the oldest, first


def test_a_closed_sessions_path_is_evicted_like_any_other():
    a_kept, b_kept = under_pressure(end_first=True)
    assert a_kept == 0  # the oldest, no session holding it: lru's first victim


def test_cli_replay_keys_the_session_baselines_by_policy(tmp_path, capsys, small_traces):
    from agentcache.cli import main
    from agentcache.trace import write_trace

    path = tmp_path / "t.jsonl"
    write_trace(path, small_traces["chat"])
    policies = ["lru", "lfu", "session-lru", "session-lfu", "pbkv"]
    args = ["replay", str(path), "--policy", ",".join(policies), "--capacity", "3000,6000", "--json"]
    assert main(args) == 0
    rows = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert sorted((r["policy"], r["capacity"]) for r in rows) == sorted((p, c) for p in policies for c in (3000, 6000))


def test_the_timed_replay_closes_each_session_at_its_workflows_end(small_traces, monkeypatch):
    import agentcache.replay.runner as runner
    from agentcache.replay.serving import serve_trace

    built: list[ReplayCache] = []

    class Recorded(ReplayCache):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            built.append(self)

    monkeypatch.setattr(runner, "ReplayCache", Recorded)
    prepared = PreparedTrace(small_traces["chat"])
    served = serve_trace(prepared, "session-lfu", 3000, time_scale=0.05)
    assert served.summary()["hit_rate"] > 0
    (cache,) = built
    assert cache.sessions and cache.cache.protected_size() == 0
    assert not cache.component._session_leaves  # every workflow of the trace ended: no session holds a path
