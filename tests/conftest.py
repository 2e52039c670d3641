"""Shared test set-up: SGLang runs in CPU mode, and small traces are generated once."""

from __future__ import annotations

import contextlib
import os

import pytest

# Must be set before SGLang is imported anywhere in the test process.
os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")
# Servers started by the tests give up on a control call after this long (default 30 s), so a test can
# stall a scheduler past it quickly.
CONTROL_TIMEOUT_S = 8
os.environ.setdefault("AGENTCACHE_CONTROL_TIMEOUT_S", str(CONTROL_TIMEOUT_S))


@pytest.fixture(scope="session")
def small_traces():
    """One small trace per generated family (a few dozen workflows each)."""
    from agentcache.workloads import FAMILIES, GenConfig, generate

    return {family: generate(family, GenConfig(workflows=30, rate=1.0, seed=3)) for family in FAMILIES}


API_KEY = "test-key"  # the operator's
# Two tenants with keys of their own (tests/test_tenants_e2e.py), and a cap of their own on active workflows
# low enough for a test to flood it.
TENANT_KEYS = {"tenant-a": "sk-tenant-a-0123", "tenant-b": "sk-tenant-b-4567"}
TENANT_WORKFLOW_CAP = 24


@pytest.fixture(scope="session")
def server(tmp_path_factory):
    """The real SGLang server with the plugin (CPU mode, tiny model, pbkv), once per test run."""
    import httpx

    from agentcache.server_ext.launcher import ServeOptions, Server, free_port

    capacity = 4000
    folder = tmp_path_factory.mktemp("server")
    log = folder / "sglang.log"
    keys = folder / "keys.txt"
    keys.write_text(f"operator: {API_KEY}\n" + "".join(f"{name}: {key}\n" for name, key in TENANT_KEYS.items()))
    opts = ServeOptions(
        model_size="tiny",
        policy="pbkv",
        port=free_port(),
        max_total_tokens=capacity,
        log_path=str(log),
        api_key=API_KEY,
        api_keys_file=str(keys),
    )
    srv = Server(opts)
    os.environ["AGENTCACHE_MAX_WORKFLOWS_PER_TENANT"] = str(TENANT_WORKFLOW_CAP)  # the operator's are uncapped
    try:
        srv.start(timeout_s=600)
    except Exception:
        print(log.read_text()[-5000:] if log.exists() else "no server log")
        raise
    finally:
        del os.environ["AGENTCACHE_MAX_WORKFLOWS_PER_TENANT"]  # this server's alone
    srv.capacity = capacity
    srv.client = httpx.Client(base_url=srv.base_url, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=120)
    yield srv
    srv.client.close()
    srv.stop()


@contextlib.contextmanager
def _recording_server(entry):
    """A stand-in for the server the bench drives: answers /generate with one streamed token, the events route
    with its count, anything else with an empty 200, and records `entry(path, headers, body)` of every POST (the
    header names in lower case). Yields (url, heard)."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    heard: list[tuple] = []

    class Recording(BaseHTTPRequestHandler):
        def log_message(self, *args):  # noqa: ANN002
            pass

        def do_POST(self):  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers["content-length"])) or b"null")
            heard.append(entry(self.path, {k.lower(): v for k, v in self.headers.items()}, body))
            data = b""
            if self.path == "/generate":
                meta = {"prompt_tokens": len(body["input_ids"]), "cached_tokens": 0, "completion_tokens": 1}
                data = f"data: {json.dumps({'output_ids': [1], 'meta_info': meta})}\n\ndata: [DONE]\n\n".encode()
            elif self.path == "/agentcache/v1/events":
                data = json.dumps({"accepted": len(body["events"]), "skipped": 0}).encode()
            self.send_response(200)
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Recording)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", heard
    finally:
        server.shutdown()


@pytest.fixture
def recording_server():
    """The bench's stand-in server (_recording_server), recording (path, body) of every POST."""
    with _recording_server(lambda path, headers, body: (path, body)) as served:
        yield served


@pytest.fixture
def recording_server_with_headers():
    """The bench's stand-in server (_recording_server), recording (path, headers, body) of every POST."""
    with _recording_server(lambda path, headers, body: (path, headers, body)) as served:
        yield served
