"""The SDK survives a server restart in the middle of a workflow, and the server restarts clean."""

from __future__ import annotations

import httpx
import openai
import pytest

import agentcache_sdk as ac

pytestmark = pytest.mark.server


def test_a_workflow_outlives_a_server_restart(tmp_path):
    from agentcache.server_ext.launcher import ServeOptions, Server, free_port

    opts = ServeOptions(
        model_size="tiny", port=free_port(), max_total_tokens=4000, log_path=str(tmp_path / "sglang.log")
    )
    ac.configure(base_url=opts.base_url)
    client = openai.OpenAI(base_url=f"{opts.base_url}/v1", api_key="none", max_retries=0)
    messages = [{"role": "system", "content": "You are the coder. " * 20}, {"role": "user", "content": "task"}]
    failures = ac.counters["end_failures"]
    server = Server(opts).start()
    try:
        with ac.workflow(name="restart") as wf:
            client.chat.completions.create(model="default", messages=messages, max_tokens=2)
            server.stop()
            with pytest.raises(openai.APIConnectionError):  # the app sees its own request fail, nothing else
                client.chat.completions.create(model="default", messages=messages, max_tokens=2)
            server.start()
            stats = httpx.get(f"{opts.base_url}/agentcache/v1/stats").json()
            assert stats["requests"] == 0 and stats["active_workflows"] == 0, "the new server starts clean"
            client.chat.completions.create(model="default", messages=messages, max_tokens=2)
        assert ac.flush(30)
        # Workflows are scoped by the credentials their requests carry (here the openai client's dummy key).
        record = httpx.get(
            f"{opts.base_url}/agentcache/v1/workflows/{wf.id}", headers={"Authorization": "Bearer none"}
        ).json()
        assert record["requests"] == 1 and record["ended"], "the end reached the restarted server"
        assert ac.counters["end_failures"] == failures
    finally:
        server.stop()
