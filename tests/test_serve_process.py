"""`agentcache serve` as a process manager runs it: one signal stops everything, a dead engine is reported.

Process managers send one SIGTERM (systemd, Kubernetes); a terminal sends SIGINT. Each test starts the
command as a user would and checks its exit status, its message, that every process it started is gone
and that its ports are free again.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest

pytestmark = pytest.mark.server

STOP_WITHIN_S = 30  # SGLang drains in-flight requests on SIGTERM (a few seconds on CPU)


def start_serve(*args: str, port: int, output: Path) -> subprocess.Popen:
    """Start `agentcache serve` with its output (and its engines') in the file `output`.

    Not a pipe: nobody reads a pipe while the server starts, and two workers print more than a pipe holds
    (64 KiB) before they are ready, so they would block on a write and never become ready.
    """
    cmd = [sys.executable, "-m", "agentcache.cli", "serve", "--model-size", "tiny", "--port", str(port)]
    cmd += ["--max-total-tokens", "4000", *args]
    with output.open("w") as sink:
        return subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT, text=True)


def wait_ready(process: subprocess.Popen, url: str, output: Path, timeout_s: float = 600) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert process.poll() is None, output.read_text()[-3000:]
        try:
            if httpx.get(url, timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise AssertionError(f"{url} not ready in {timeout_s} s")


def descendants(process: subprocess.Popen) -> list[psutil.Process]:
    return psutil.Process(process.pid).children(recursive=True)


def kill_tree(process: subprocess.Popen) -> None:
    """Kill a server a failed test left running, its engines first: killing `agentcache serve` alone leaves
    SGLang's launcher and scheduler running, and an idle scheduler on CPU took a core for the rest of the
    suite (seen in CI, whose timed tests then failed)."""
    if process.poll() is not None:
        return
    for child in descendants(process):
        try:
            child.kill()
        except psutil.NoSuchProcess:
            pass
    process.kill()
    process.wait()


def assert_all_gone(processes: list[psutil.Process], ports: list[int]) -> None:
    _, alive = psutil.wait_procs(processes, timeout=10)
    assert not alive, f"left running: {[p.pid for p in alive]}"
    from agentcache.server_ext.launcher import port_is_free

    taken = [p for p in ports if not port_is_free("127.0.0.1", p)]
    assert not taken, f"ports still taken: {taken}"


def test_one_sigterm_stops_serve_and_leases_run_out_on_an_idle_server(tmp_path):
    from agentcache.server_ext.launcher import free_port

    port = free_port()
    output = tmp_path / "serve.log"
    serve = start_serve("--lease", "2", port=port, output=output)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_ready(serve, f"{url}/agentcache/v1/health", output)
        # The engine's first request is slow on CPU (9 s seen, past the 2 s lease): an untagged one takes it.
        warm_up = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 1}}
        httpx.post(f"{url}/generate", json=warm_up, timeout=60).raise_for_status()
        tags = {"v": 1, "workflow": "forgotten", "agent": "a:x"}
        body = {"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 1, "custom_params": {"agentcache": tags}}}
        httpx.post(f"{url}/generate", json=body, timeout=60).raise_for_status()
        assert httpx.get(f"{url}/agentcache/v1/stats").json()["active_workflows"] == 1
        time.sleep(4)  # past the lease, and no request comes
        stats = httpx.get(f"{url}/agentcache/v1/stats").json()
        assert stats["active_workflows"] == 0 and stats["expired_workflows"] == 1, "the lease ran out on the clock"
        children = descendants(serve)
        started = time.monotonic()
        serve.send_signal(signal.SIGTERM)
        serve.wait(timeout=STOP_WITHIN_S)
        err = output.read_text()
        assert serve.returncode == 128 + signal.SIGTERM and time.monotonic() - started < STOP_WITHIN_S
        assert "SIGTERM received, stopping the server" in err
        # SGLang's own shutdown (its launcher drains and asks each scheduler to exit), not its crash path.
        assert "Gracefully exiting" in err and "crashed" not in err and "SIGQUIT" not in err, err[-3000:]
        assert_all_gone(children, [port])
    finally:
        kill_tree(serve)


def test_serve_says_so_and_exits_nonzero_when_the_engine_dies(tmp_path):
    from agentcache.server_ext.launcher import free_port

    port = free_port()
    output = tmp_path / "serve.log"
    serve = start_serve(port=port, output=output)
    try:
        wait_ready(serve, f"http://127.0.0.1:{port}/agentcache/v1/health", output)
        time.sleep(3)  # serve itself polls for readiness too: let it see the server up
        children = descendants(serve)
        (scheduler,) = [p for p in children if "scheduler" in " ".join(p.cmdline())]
        scheduler.kill()  # SGLang's launcher notices a dead scheduler and takes the whole server down
        serve.wait(timeout=STOP_WITHIN_S)
        err = output.read_text()
        assert serve.returncode != 0
        assert "the server stopped on its own (killed by SIGKILL)" in err, err[-2000:]
        assert_all_gone(children, [port])
    finally:
        kill_tree(serve)


def test_ctrl_c_stops_a_cluster_with_every_worker_and_the_router(tmp_path):
    from agentcache.server_ext.launcher import free_port

    port = free_port()
    output = tmp_path / "serve.log"
    serve = start_serve("--workers", "2", port=port, output=output)
    try:
        wait_ready(serve, f"http://127.0.0.1:{port}/workers", output)
        while len(httpx.get(f"http://127.0.0.1:{port}/workers", timeout=5).json().get("workers", [])) < 2:
            time.sleep(1)
        children = descendants(serve)
        worker_ports = [port + 1, port + 2]
        serve.send_signal(signal.SIGINT)
        serve.wait(timeout=STOP_WITHIN_S)
        err = output.read_text()
        assert serve.returncode == 128 + signal.SIGINT, err[-2000:]
        assert "SIGINT received, stopping the cluster" in err
        assert_all_gone(children, [port, *worker_ports])
    finally:
        kill_tree(serve)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--port", "99999"], "--port must be in 1-65535, got 99999"),
        (["--max-total-tokens", "-5"], "--max-total-tokens must be >= 1 token, got -5"),
        (["demo", "--port", "0"], "--port must be in 1-65535, got 0"),
        (["demo", "--capacity", "-1"], "--capacity must be >= 1 token, got -1"),
        (["bench", "--port", "70000"], "--port must be in 1-65535, got 70000"),
        (["--policy", "nope"], "--policy='nope': unknown policy 'nope'"),
        (["--policy", "lfu", "--workers", "2"], "--policy='lfu': the plugin runs lru, lifecycle"),
        (["--lease", "0"], "--lease must be > 0"),
        (["--policy", "kvflow"], "kvflow needs a static call graph: set --call-graph"),
        (["--call-graph", "/absent.json"], "--call-graph='/absent.json': [Errno 2]"),
        (
            ["--predictor", "neural:/absent.pt"],
            "--predictor='neural:/absent.pt': no neural predictor file at /absent.pt",
        ),
    ],
)
def test_bad_server_flags_are_refused_at_once_by_the_plugins_own_checks(args, message, capsys):
    """`agentcache serve`, `demo` and `bench` start servers. Before, SGLang started first (12-50 s) and the error
    came as its traceback, or not at all: `serve --port 99999` was reported as served. Each names the flag the
    user gave (the plugin's own checks named its environment variables: `--lease 0` said AGENTCACHE_LEASE_S)."""
    from agentcache.cli import main

    started = time.monotonic()
    command = args if args[0] in ("demo", "bench") else ["serve", *args]
    assert main(command) == 2
    err = capsys.readouterr().err
    assert message in err.replace("\n", "") and "Traceback" not in err
    assert time.monotonic() - started < 10, "refused before any server started"


def test_the_plugins_start_up_check_names_the_sglang_flag_that_set_a_bad_value(monkeypatch):
    """Started by SGLang's own launcher, the plugin's settings come as `--agentcache-*` flags, which it exports as
    variables for the schedulers; its check named the variable (AGENTCACHE_LEASE_S), not the flag the user gave."""
    import argparse

    from agentcache.server_ext import config, plugin

    # What the hook exports stays in the test's own copy of the environment.
    monkeypatch.setattr(os, "environ", {k: v for k, v in os.environ.items() if not k.startswith("AGENTCACHE_")})
    flags = {f"agentcache_{s}": None for s in ("policy", "lease", "call_graph", "predictor", "prefetch")}
    with pytest.raises(config.ConfigError, match="^--agentcache-lease must be > 0, got 0.0$"):
        plugin._capture_cli_args(None, argparse.Namespace(**flags | {"agentcache_lease": 0.0}))
    del os.environ[config.LEASE_ENV]
    os.environ[config.POLICY_ENV] = "kvflow"  # set by the environment: named so
    with pytest.raises(config.ConfigError, match="^kvflow needs a static call graph: set AGENTCACHE_CALL_GRAPH$"):
        plugin._capture_cli_args(None, argparse.Namespace(**flags))


def test_a_server_that_fails_while_starting_is_not_left_running(tmp_path, monkeypatch):
    """`with Server(...)` never reaches __exit__ when starting raises (an engine that exited, a failed freeze of
    its garbage collector, Ctrl-C): the server was left running, holding its port, and the next run on that port
    failed ("address already in use")."""
    from agentcache.server_ext.launcher import ServeOptions, Server, free_port

    server = Server(ServeOptions(model_size="tiny", port=free_port(), log_path=str(tmp_path / "sglang.log")))
    launched = []

    def interrupted(timeout_s: float) -> None:
        launched.append(psutil.Process(server.process.pid))
        raise KeyboardInterrupt

    monkeypatch.setattr(server, "wait_ready", interrupted)
    with pytest.raises(KeyboardInterrupt):
        server.start()
    assert server.process is None and not launched[0].is_running(), "the launched engine was stopped"
