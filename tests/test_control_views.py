"""The read-only control calls (issue 55, case 7), on the server's cache with SGLang's real classes: answered from
indexes kept as requests are tagged, a page at a time; and the rate limit in front of them."""

from __future__ import annotations

import pytest
from plugin_on_sglang import plugin_cache, scheduler_request

from agentcache.engine.adapter import cached_nodes
from agentcache.policy.nodes import TAGS_ATTR
from agentcache.server_ext.control_limits import MAX_PAGE, Page, RateLimiter
from agentcache.tags import Stamped, Tags, WorkflowKey


@pytest.fixture
def cache(monkeypatch):
    return plugin_cache(monkeypatch, 60_000)


def serve(cache, rid: str, tokens: list[int], workflow: str, agent: str = "a", tenant: str = "", fixed: int = 16):
    tags = Tags(workflow=workflow, agent=agent, fixed_tokens=fixed, ts=1.0)
    req = scheduler_request(rid, tokens, Stamped(tenant, tags))
    cache.observe(req)
    cache.checkpoint_into_tree(req, up_to=len(tokens))
    cache.on_release(req, checkpointed=True)


def walked_view(cache, key: WorkflowKey) -> tuple[int, int, list[str]]:
    """What the view said before: a walk of every cached node."""
    nodes = [n for n in cached_nodes(cache) if key in getattr(n, TAGS_ATTR, None).workflows]
    agents = sorted({a for n in nodes for a in getattr(n, TAGS_ATTR).workflows[key]})
    return len(nodes), sum(len(n.key) for n in nodes), agents


def test_a_workflows_view_reads_its_own_nodes_not_the_tree(cache, monkeypatch):
    """Before, `GET .../workflows/{id}` walked every cached node on the scheduler thread. Now it reads the nodes
    the workflow's requests were tagged on (and their ancestors, where a later request split them): the same
    answer, its work independent of how many other workflows the tree holds."""
    from agentcache.server_ext.views import workflow_view

    system = list(range(1000, 1016))
    for i in range(300):  # other workflows' nodes, each of its own, under the shared system prompt
        serve(cache, f"other-{i}", system + [5000 + i] * 8, f"other-{i}")
    turn = system + list(range(2000, 2040))
    serve(cache, "mine-1", turn, "mine", agent="planner")
    serve(cache, "mine-2", turn + list(range(3000, 3020)), "mine", agent="coder")
    serve(cache, "split", turn[:30] + [7] * 10, "splitter")  # splits one of mine's nodes: a parent it never tagged
    key = WorkflowKey("", "mine")

    looked_up = []
    core = cache.tree_core
    by_id = core.node_by_id
    monkeypatch.setattr(core, "node_by_id", lambda node_id: looked_up.append(node_id) or by_id(node_id))
    view = workflow_view(cache, key)
    assert (view["cached_nodes"], view["cached_tokens"], view["cached_agents"]) == walked_view(cache, key)
    assert view["cached_tokens"] == 76 and view["cached_fixed_tokens"] == 16 and view["requests"] == 2
    assert view["cached_nodes"] == 4, "the system prompt, the first turn split in two, the second turn"
    assert len(looked_up) <= 4, "its own nodes, not the 300 other workflows'"


def test_statistics_list_a_page_of_workflows_most_recent_first(cache):
    for i in range(250):
        serve(cache, f"r{i}", [9000 + i] * 4, f"w{i}", tenant="t")
    serve(cache, "o", [8000] * 4, "other-tenants", tenant="u")
    operator = cache.stats("", operator=True)
    assert operator["workflows_total"] == 251 and operator["next_offset"] == 100
    assert list(operator["workflows"])[:2] == ["u/other-tenants", "t/w249"] and len(operator["workflows"]) == 100

    own = cache.stats("t", operator=False, page=Page(offset=200, limit=100))
    assert own["workflows_total"] == 250 and own["next_offset"] is None and own["active_workflows"] == 250
    assert list(own["workflows"]) == [f"w{i}" for i in range(49, -1, -1)]
    assert own["requests"] == 250 and "other-tenants" not in own["workflows"]


def test_a_page_is_bounded_and_its_query_checked():
    assert Page.parse(None, None) == Page(0, 100)
    assert Page.parse("5", "1000") == Page(5, MAX_PAGE)
    for offset, limit in (("-1", "10"), ("0", "0"), ("0", "1001"), ("x", "1")):
        with pytest.raises(ValueError):
            Page.parse(offset, limit)
    assert Page.of({"offset": -3, "limit": 10**9}) == Page(0, MAX_PAGE)


def test_the_rate_limit_is_a_token_bucket_per_caller():
    now = [0.0]
    limiter = RateLimiter(rate=10, burst=20, clock=lambda: now[0])
    assert [limiter.take("a") for _ in range(20)] == [0.0] * 20
    assert limiter.take("a") == pytest.approx(0.1), "refused: the next call in a tenth of a second"
    assert limiter.take("b") == 0.0, "another caller has a bucket of its own"
    now[0] += 0.5
    assert [limiter.take("a") > 0 for _ in range(6)] == [False] * 5 + [True]
