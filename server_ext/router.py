"""`agentcache serve --workers N`: N SGLang workers with the plugin behind sglang-router, and our front before it.

Clients point at the front (server_ext/front.py), which hands the router a routing key and the worker a
forwarded header for clients that name their session in another stack's form, and passes the rest on; the
router listens on a port of its own beside it. The router runs ``--policy manual``: it pins each ``x-smg-routing-key`` to one
worker. The SDK chooses that key per request (``workflow-aware``, the default:
``agentcache-worker-<slot>``, the slot :class:`agentcache.routing.WorkflowAwareRouting`
chose; or ``workflow-affinity``: the workflow id). The router drops body
fields, so tags reach the workers through the ``x-request-id-agentcache``
header it forwards; it 404s ``/agentcache/...``, so clients send end events and
tool events to every worker it lists on ``GET /workers`` (agentcache_sdk does).

A slot is a worker only if the router placed the N slot keys on N different
workers. ``--assignment-mode min_group`` places a new key on the worker with
the fewest routing keys *in flight* (sglang-router 0.3.2,
``WorkerRoutingKeyLoad``: a key counts while a request with it is unanswered;
ties are broken at random), so N keys that arrive one after another may share
a worker. :meth:`Cluster.start` therefore places them itself before anyone
else can: it holds a streamed request open on each slot key in turn, reads
from the router's ``smg_worker_routing_keys_active`` gauge which worker took
it, and fails unless each worker took one. The router forgets a key idle for
``--max-idle-secs`` (4 h), so a keep-alive request touches every slot key each
``SLOT_KEEPALIVE_S``.

The router's own process (its command line, its entry point) is
server_ext/router_process.py.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx

from agentcache.router_workers import parse_router_workers
from agentcache.routing import slot_key
from agentcache.server_ext.front import front_command
from agentcache.server_ext.launcher import (
    ServeOptions,
    Server,
    ServerError,
    ensure_model,
    free_port,
    port_is_free,
    run_until_signal,
)
from agentcache.server_ext.router_process import ASSIGNMENT_MODES, router_command, routing_keys_active

ROUTING_HEADER = "x-smg-routing-key"
PIN_MAX_NEW_TOKENS = 8192  # a held request must outlast the placing of the other slot keys (SGLang clips it
PIN_FALLBACK_TOKENS = 1024  # to the KV pool; the model's context length is asked first)
PIN_WAIT_S = 30.0  # for the router to count one slot key in flight
SLOT_KEEPALIVE_S = 1800.0  # well inside the router's --max-idle-secs (4 h)


class ClusterError(RuntimeError):
    pass


def _log_beside(log_path: str | None, role: str) -> str | None:
    """`serve.log` -> `serve.worker0.log`: one log per process when the caller asked for a log."""
    if log_path is None:
        return None
    path = Path(log_path)
    return str(path.with_name(f"{path.stem}.{role}{path.suffix or '.log'}"))


class Cluster:
    """N agentcache workers, the router and the front; a context manager that always stops every process tree.

    `opts` is every worker's configuration (``max_total_tokens`` is per worker);
    its port is replaced: worker i listens on ``worker_ports[i]`` (default
    ``port + 1 + i``), clients use the front's `port`, and the router takes a free one. While the
    cluster runs inside ``with``, SIGTERM unwinds the block (unless the app
    set its own handler), so the workers stop too.
    """

    def __init__(
        self,
        opts: ServeOptions,
        workers: int,
        port: int,
        *,
        worker_ports: Sequence[int] | None = None,
        router_metrics_port: int | None = None,
        assignment_mode: str = "min_group",
    ):
        if workers < 1:
            raise ClusterError(f"workers must be >= 1, got {workers}")
        ports = list(worker_ports) if worker_ports is not None else [port + 1 + i for i in range(workers)]
        if len(ports) != workers:
            raise ClusterError(f"{workers} workers need {workers} worker ports, got {len(ports)}")
        if len({port, *ports}) != workers + 1:
            raise ClusterError(f"port {port} and worker ports {ports} must all differ")
        if assignment_mode not in ASSIGNMENT_MODES:
            raise ClusterError(f"assignment_mode must be one of {', '.join(ASSIGNMENT_MODES)}, got {assignment_mode!r}")
        self.opts = opts
        self.port = port
        self.router_port: int | None = None  # picked at start
        self.router_metrics_port = router_metrics_port
        self.assignment_mode = assignment_mode
        self.workers = [
            Server(replace(opts, port=port, log_path=_log_beside(opts.log_path, f"worker{i}")))
            for i, port in enumerate(ports)
        ]
        self.router: subprocess.Popen | None = None
        self.front: subprocess.Popen | None = None
        self.metrics_port: int | None = None
        # worker URL of each routing slot (slot_key(i) goes to slot_workers[i]); set by start() under min_group
        self.slot_workers: list[str] | None = None
        self._logs: list[Any] = []
        self._previous_sigterm: Any = None
        self._stopping = threading.Event()
        self._keepalive: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        """Where clients (and agentcache_sdk.configure) point: the front."""
        return f"http://{self.opts.host}:{self.port}"

    @property
    def router_url(self) -> str:
        return f"http://{self.opts.host}:{self.router_port}"

    @property
    def worker_urls(self) -> list[str]:
        return [w.base_url for w in self.workers]

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.opts.api_key}"} if self.opts.api_key else {}

    # -- start

    def start(self, timeout_s: float = 600.0) -> Cluster:
        """Start the workers in parallel, then the router, then the front; return once the front answers with the
        router's list of every worker healthy."""
        host = self.opts.host
        ports = [self.port, *(w.opts.port for w in self.workers)]
        if self.router_metrics_port is not None:
            ports.append(self.router_metrics_port)
        busy = [p for p in ports if not port_is_free(host, p)]
        if busy:
            raise ClusterError(f"ports already in use on {host}: {', '.join(map(str, busy))}")
        # Make the default model once, before N workers race to make it.
        model = ensure_model(self.opts.model_path, self.opts.model_size)
        for w in self.workers:
            w.opts = replace(w.opts, model_path=model)
        deadline = time.monotonic() + timeout_s
        self._stopping.clear()
        try:
            with ThreadPoolExecutor(len(self.workers)) as pool:
                for future in [pool.submit(w.start, timeout_s) for w in self.workers]:
                    future.result()
            # Picked only now: a worker's SGLang takes extra ports of its own while it starts.
            self.metrics_port = self.router_metrics_port or free_port(host)
            self.router_port = free_port(host)
            self._start_router(self.metrics_port, deadline)
            if self.assignment_mode == "min_group":
                self.slot_workers = self._place_slots(deadline)
                self._keepalive = threading.Thread(
                    target=self._keep_slots, name="agentcache-slot-keepalive", daemon=True
                )
                self._keepalive.start()
            self.front = self._spawn(
                front_command(self.router_url, self.worker_urls, host=host, port=self.port), "front"
            )
            self._wait_listed(self.front, self.base_url, "front", deadline)
        except BaseException:
            self.stop()
            raise
        return self

    def _start_router(self, metrics_port: int, deadline: float) -> None:
        cmd = router_command(
            self.worker_urls,
            host=self.opts.host,
            port=self.router_port,
            metrics_port=metrics_port,
            api_key=self.opts.api_key,
            assignment_mode=self.assignment_mode,
        )
        self.router = self._spawn(cmd, "router")
        self._wait_listed(self.router, self.router_url, "router", deadline)

    def _spawn(self, cmd: list[str], role: str) -> subprocess.Popen:
        """Start one of the cluster's own processes in a session of its own, its output in its log if asked."""
        log_path = _log_beside(self.opts.log_path, role)
        log = open(log_path, "ab") if log_path else None
        if log is not None:
            self._logs.append(log)
        return subprocess.Popen(
            cmd, start_new_session=True, stdout=log or None, stderr=subprocess.STDOUT if log else None
        )

    def _wait_listed(self, process: subprocess.Popen, url: str, role: str, deadline: float) -> None:
        """Until `url` lists every worker healthy (`GET /workers`, the router's, through the front or not)."""
        log = _log_beside(self.opts.log_path, role)
        hint = f" (log: {log})" if log else ""
        name = {"router": "sglang-router", "front": "the front"}[role]
        listed: list[str] = []
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise ClusterError(f"{name} exited with status {process.returncode} while starting{hint}")
            listed = self._healthy_workers(url)
            if set(self.worker_urls) <= set(listed):
                return
            time.sleep(0.5)
        raise ClusterError(
            f"{name} did not list every worker as healthy in time: {len(listed)} of {len(self.workers)}{hint}"
        )

    def _healthy_workers(self, url: str) -> list[str]:
        """Worker URLs the router routes to now. Its /readiness turns 200 with the first one, so it is not enough."""
        try:
            r = httpx.get(f"{url}/workers", headers=self._headers(), timeout=5.0)
            workers = parse_router_workers(r.json()) if r.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            return []
        return workers.healthy if workers is not None else []

    def _place_slots(self, deadline: float) -> list[str]:
        """Put routing slot i on a worker of its own, for every i; the worker URL of each slot.

        Under min_group a new key goes to a worker with the fewest keys in flight, so each slot key is
        placed while the earlier ones are held in flight (a streamed request left open), and the router's
        gauge tells where it went. The held requests are dropped at the end (SGLang aborts them).
        """
        body = {
            "text": "agentcache: placing the routing slots",
            "sampling_params": {"max_new_tokens": self._hold_tokens(), "ignore_eos": True, "temperature": 0.0},
            "stream": True,
        }
        placed: list[str] = []
        with httpx.Client(timeout=httpx.Timeout(60.0, connect=5.0)) as client, contextlib.ExitStack() as held:
            for slot in range(len(self.workers)):
                headers = {**self._headers(), ROUTING_HEADER: slot_key(slot)}
                response = held.enter_context(
                    client.stream("POST", f"{self.router_url}/generate", json=body, headers=headers)
                )
                if response.status_code != 200:
                    raise ClusterError(
                        f"placing routing slot {slot}: sglang-router answered {response.status_code}: "
                        f"{response.read()[:300]!r}"
                    )
                placed.append(self._slot_worker(slot, placed, deadline))
        return placed

    def _hold_tokens(self) -> int:
        """New tokens for a held request: as many as the model's context allows, up to PIN_MAX_NEW_TOKENS."""
        try:
            r = httpx.get(f"{self.worker_urls[0]}/v1/models", headers=self._headers(), timeout=10.0)
            context = int(r.json()["data"][0]["max_model_len"])
        except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError):
            return PIN_FALLBACK_TOKENS
        return max(16, min(PIN_MAX_NEW_TOKENS, context - 64))

    def _slot_worker(self, slot: int, placed: list[str], deadline: float) -> str:
        """The worker the router counts slot key `slot` in flight on, the `placed` ones still held there."""
        until = min(deadline, time.monotonic() + PIN_WAIT_S)
        active: dict[str, float] = {}
        while time.monotonic() < until:
            active = self._keys_active()
            counts = {url: active.get(url, 0.0) for url in self.worker_urls}
            if sum(counts.values()) > len(placed):
                new = [url for url, n in counts.items() if n and url not in placed]
                if sum(counts.values()) == len(placed) + 1 and len(new) == 1 and all(counts[u] == 1 for u in placed):
                    return new[0]
                raise ClusterError(
                    f"sglang-router did not put routing slot {slot} on a worker of its own (routing keys in flight "
                    f"per worker: {counts}; slots so far: {placed}): was another client sending already?"
                )
            time.sleep(0.05)
        raise ClusterError(
            f"sglang-router did not count routing slot {slot} in flight within {PIN_WAIT_S:g} s (routing keys in "
            f"flight per worker: {active}); a held request may have finished early"
        )

    def _keys_active(self) -> dict[str, float]:
        try:
            r = httpx.get(f"http://{self.opts.host}:{self.metrics_port}/metrics", timeout=5.0)
        except httpx.HTTPError:
            return {}
        return routing_keys_active(r.text) if r.status_code == 200 else {}

    def _keep_slots(self) -> None:
        """Touch every slot key now and then, so the router never forgets (and re-places) an idle one."""
        body = {"text": "agentcache: keep-alive", "sampling_params": {"max_new_tokens": 1}}
        while not self._stopping.wait(SLOT_KEEPALIVE_S):
            for slot in range(len(self.workers)):
                try:
                    httpx.post(
                        f"{self.router_url}/generate",
                        json=body,
                        headers={**self._headers(), ROUTING_HEADER: slot_key(slot)},
                        timeout=60.0,
                    )
                except httpx.HTTPError:
                    pass  # the router or the worker is down: the cluster's poll() reports it

    # -- stop

    def stop(self, grace_s: float = 20.0) -> None:
        """Stop the front, the router and every worker's process tree at once: each drains what it has in flight
        for up to `grace_s`, so a stop takes one grace period, not the router's and then the workers'."""
        self._stopping.set()
        own = [p for p in (self.front, self.router) if p is not None]
        self.front = self.router = None
        with ThreadPoolExecutor(len(self.workers) + 2) as pool:
            stops = [pool.submit(w.stop, grace_s) for w in self.workers]
            stops += [pool.submit(_stop_group, p, grace_s) for p in own]
            for stopped in stops:
                stopped.result()
        for log in self._logs:
            log.close()
        self._logs.clear()

    def poll(self) -> int | None:
        """The exit status of the front, the router or a worker once one of them exited, else None."""
        processes = [p for p in (self.front, self.router, *(w.process for w in self.workers)) if p is not None]
        if not processes:
            return 0
        for process in processes:
            code = process.poll()
            if code is not None:
                return code
        return None

    def __enter__(self) -> Cluster:
        if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
            self._previous_sigterm = signal.signal(signal.SIGTERM, _exit_on_signal)
        try:
            return self.start() if self.router is None else self
        except BaseException:
            self._restore_sigterm()
            raise

    def __exit__(self, *exc: object) -> None:
        try:
            self.stop()
        finally:
            self._restore_sigterm()

    def _restore_sigterm(self) -> None:
        if self._previous_sigterm is not None:
            signal.signal(signal.SIGTERM, self._previous_sigterm)
            self._previous_sigterm = None


def _exit_on_signal(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def _stop_group(process: subprocess.Popen, grace_s: float) -> None:
    try:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(grace_s)
                return
            except subprocess.TimeoutExpired:
                pass
        os.killpg(process.pid, signal.SIGKILL)  # also children of a launcher that died first
    except ProcessLookupError:
        pass
    process.wait()


def serve_cluster_forever(opts: ServeOptions, workers: int, port: int) -> int:
    """Run `workers` workers behind the router and the front on `port` until one exits or we get SIGINT/SIGTERM."""
    try:
        cluster = Cluster(opts, workers, port)

        def start() -> None:
            cluster.start()
            slots = ", ".join(f"{slot_key(i)} -> {url}" for i, url in enumerate(cluster.slot_workers or []))
            print(
                f"agentcache: serving on {cluster.base_url} (our front, sglang-router's manual policy) in front of "
                f"{workers} workers {', '.join(cluster.worker_urls)} "
                f"(policy {opts.policy}, {'CPU' if opts.cpu_mode else 'GPU'} mode); routing slots {slots}: "
                "agentcache_sdk routes workflow-aware by default (AGENTCACHE_ROUTING=workflow-affinity pins whole "
                "workflows)",
                file=sys.stderr,
            )

        return run_until_signal(start, cluster.poll, cluster.stop, "the cluster")
    except (ClusterError, ServerError) as exc:
        print(f"agentcache: {exc}", file=sys.stderr)
        return 1
