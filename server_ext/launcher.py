"""`agentcache serve`: start SGLang with the plugin and the right flags, and stop the whole process tree.

On a machine without a GPU it runs SGLang's CPU engine (torch-native attention)
and, when no model is given, makes a small random-weight model once and reuses
it. The CPU work-arounds (SGLANG_USE_CPU_ENGINE, the HiCache shims applied by
the plugin) apply in CPU mode only.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from agentcache.server_ext.model import is_model_dir, make_model

DEFAULT_PORT = 30000
# CPU dev mode's KV capacity when none is given: SGLang would size the pool from the machine's free
# memory (20 GB for the tiny model on a 24 GB machine), where a dev server needs a few MB.
CPU_DEFAULT_MAX_TOTAL_TOKENS = 65536


def has_gpu() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def default_model_dir(size: str) -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return base / "agentcache" / "models" / f"{size}-v1"


def ensure_model(model_path: str | None, size: str) -> str:
    """The model to serve: the one given, else the bundled default (made once)."""
    if model_path:
        return model_path
    path = default_model_dir(size)
    if not is_model_dir(path):
        print(f"agentcache: making a {size} random-weight model in {path} (once)", file=sys.stderr)
        make_model(path, size)
    return str(path)


@dataclass
class ServeOptions:
    model_path: str | None = None
    model_size: str = "small"
    policy: str = "pbkv"
    cpu: bool | None = None  # None: CPU mode exactly when there is no GPU
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    max_total_tokens: int | None = None  # KV capacity in tokens (SGLang sizes it from memory otherwise)
    hicache: bool = False
    lease_s: float | None = None
    call_graph: str | None = None
    predictor: str | None = None
    prefetch: str | None = None  # conservative | off (with --hicache)
    api_key: str | None = None  # the operator's key
    api_keys_file: str | None = None  # a key per tenant (server_ext/tenancy.py); may hold the operator's key
    salt_per_tenant: bool = False  # each tenant's prompts in a prefix cache of its own
    plugin: bool = True  # False: plain SGLang, without agentcache (the baselines of `agentcache bench`)
    enable_metrics: bool = True
    extra_args: list[str] = field(default_factory=list)
    log_path: str | None = None
    cpu_threads: int | None = None  # CPU mode: the engine's torch threads (None: torch's default, one per core)

    @property
    def cpu_mode(self) -> bool:
        return self.cpu if self.cpu is not None else not has_gpu()

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def operator_key(self) -> str | None:
        """The key the launcher's own calls carry: --api-key, else the keys file's operator entry."""
        if self.api_key or not self.api_keys_file:
            return self.api_key
        from agentcache.server_ext.tenancy import load_keys

        return load_keys(self.api_keys_file).operator


# SGLang loads only the plugins this names; a name no plugin has means none (plain SGLang).
NO_PLUGINS = "none"
# glibc hands a freed block of 1 MB or more back to the system at once. By default it raises that threshold (up to
# 32 MB) each time it frees a large block and keeps the freed heap below it: an HTTP process that had served a few
# 1 MB bodies held 150-300 MB of freed heap for good (docs/design/reliability.md). Set unless the environment does.
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(1 << 20)}


def sglang_command(opts: ServeOptions, model_path: str) -> tuple[list[str], dict[str, str]]:
    """The command line and environment that start SGLang with the plugin (or, with plugin=False, without)."""
    cmd = [sys.executable, "-m", "sglang.launch_server", "--model-path", model_path]
    cmd += ["--host", opts.host, "--port", str(opts.port)]
    env = {**MALLOC_ENV, **os.environ}
    if not opts.plugin:
        env["SGLANG_PLUGINS"] = NO_PLUGINS
    else:
        cmd += ["--radix-cache-backend", "agentcache", "--agentcache-policy", opts.policy]
    if opts.lease_s is not None:
        cmd += ["--agentcache-lease", str(opts.lease_s)]
    if opts.call_graph:
        cmd += ["--agentcache-call-graph", opts.call_graph]
    if opts.predictor:
        cmd += ["--agentcache-predictor", opts.predictor]
    if opts.prefetch:
        cmd += ["--agentcache-prefetch", opts.prefetch]
    capacity = opts.max_total_tokens
    sized_by_user = any(a.split("=")[0] in ("--max-total-tokens", "--mem-fraction-static") for a in opts.extra_args)
    if capacity is None and opts.cpu_mode and not sized_by_user:
        capacity = CPU_DEFAULT_MAX_TOTAL_TOKENS
    if capacity:
        cmd += ["--max-total-tokens", str(capacity)]
    if opts.api_key:
        cmd += ["--api-key", opts.api_key]
    if opts.api_keys_file:
        cmd += ["--agentcache-api-keys-file", opts.api_keys_file]
    if opts.salt_per_tenant:
        cmd += ["--agentcache-salt-per-tenant"]
    if opts.enable_metrics:
        cmd += ["--enable-metrics"]
    cmd += ["--enable-cache-report"]  # usage.prompt_tokens_details.cached_tokens in OpenAI responses
    if opts.cpu_mode:
        env["SGLANG_USE_CPU_ENGINE"] = "1"
        if opts.cpu_threads:
            env["OMP_NUM_THREADS"] = str(opts.cpu_threads)
        cmd += ["--device", "cpu", "--attention-backend", "torch_native", "--skip-server-warmup"]
        if opts.hicache:
            cmd += ["--hicache-io-backend", "direct", "--hicache-mem-layout", "layer_first"]
    if opts.hicache:
        cmd += ["--enable-hierarchical-cache", "--hicache-ratio", "4", "--hicache-write-policy", "write_through"]
    cmd += opts.extra_args
    return cmd, env


class ServerError(RuntimeError):
    pass


def port_is_free(host: str, port: int) -> bool:
    """Whether a server could listen on `port` now. Like uvicorn and SGLang, it may reuse a port whose last
    connections still wait out TIME_WAIT (a server that just stopped leaves some): only a listener blocks it."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1", low: int = 10000, high: int = 21999) -> int:
    """A free port below the kernel's ephemeral range (and SGLang's own picks, 22000-29999).

    A port from bind(0) can be handed to some outgoing connection in the
    minutes before the router binds it; ports below that range it never hands out.
    """
    for port in random.sample(range(low, high + 1), 256):
        if port_is_free(host, port):
            return port
    raise ServerError(f"no free port found in {low}-{high} on {host}")


class Server:
    """A running SGLang server with the plugin; a context manager that always stops the whole tree."""

    def __init__(self, opts: ServeOptions):
        self.opts = opts
        self.process: subprocess.Popen | None = None
        self._log = None

    @property
    def base_url(self) -> str:
        return self.opts.base_url

    def start(self, timeout_s: float = 300.0) -> Server:
        model = ensure_model(self.opts.model_path, self.opts.model_size)
        cmd, env = sglang_command(self.opts, model)
        self._log = None
        if self.opts.log_path:
            Path(self.opts.log_path).parent.mkdir(parents=True, exist_ok=True)
            self._log = open(self.opts.log_path, "ab")
        # A new session: the server and every process it spawns form one group we can signal together.
        self.process = subprocess.Popen(
            cmd,
            env=env,
            start_new_session=True,
            stdout=self._log or None,
            stderr=subprocess.STDOUT if self._log else None,
        )
        try:
            self.wait_ready(timeout_s)
            if self.opts.cpu_mode:
                self.freeze_gc()
        except BaseException:  # an engine that exited, a failed freeze, Ctrl-C: `with Server()` never reaches
            self.stop()  # its __exit__ when __enter__ raises, and the server would be left running on its port
            raise
        return self

    def freeze_gc(self) -> None:
        """Move everything allocated so far out of the garbage collector's reach, as SGLang does after its warm-up.

        CPU dev mode skips that warm-up (--skip-server-warmup), and SGLang's own freeze then asks before its
        HTTP server listens and fails (the plugin makes it wait; a plain SGLang baseline has no plugin), so
        every full collection would scan the model and the tokenizer again: pauses of tens of milliseconds in
        the scheduler, at moments that differ from run to run.
        """
        try:
            httpx.post(f"{self.base_url}/freeze_gc", headers=self.auth_headers(), timeout=60).raise_for_status()
        except httpx.HTTPError as exc:
            raise ServerError(f"SGLang did not freeze its garbage collector: {exc}" + self._log_hint()) from None

    def auth_headers(self) -> dict[str, str]:
        key = self.opts.operator_key
        return {"Authorization": f"Bearer {key}"} if key else {}

    def wait_ready(self, timeout_s: float) -> None:
        headers = self.auth_headers()
        # The plugin's health route asks every scheduler; a plain SGLang server has its own.
        ready = "/agentcache/v1/health" if self.opts.plugin else "/health"
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise ServerError(
                    f"SGLang exited with status {self.process.returncode} while starting" + self._log_hint()
                )
            try:
                r = httpx.get(f"{self.base_url}{ready}", headers=headers, timeout=5.0)
                if r.status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(1.0)
        raise ServerError(f"SGLang did not become ready in {timeout_s:.0f} s" + self._log_hint())

    def poll(self) -> int | None:
        """SGLang's exit status once it exited (0 when it was never started), else None."""
        return self.process.poll() if self.process is not None else 0

    def _log_hint(self) -> str:
        return f" (log: {self.opts.log_path})" if self.opts.log_path else ""

    def stop(self, grace_s: float = 20.0) -> None:
        """SGLang's own shutdown: SIGTERM to its launcher alone, which drains what is in flight, asks each
        scheduler to release its memory and exit, and ends the rest of its tree; whatever of the group is left
        after `grace_s` (or after a launcher that died first) is killed. A SIGTERM to the whole group killed
        the schedulers mid-step instead: SGLang took that for a crash (a crash report in the log, a 5 s pause
        for GPU diagnostics) and, on a GPU, a scheduler killed mid-release can leave its memory held."""
        process, self.process = self.process, None
        if process is not None:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(grace_s)
                except subprocess.TimeoutExpired:
                    pass
            _signal_group(process, signal.SIGKILL)
            process.wait()
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> Server:
        return self.start() if self.process is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _signal_group(process: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(process.pid, sig)
    except ProcessLookupError:
        pass


class _Stopped(Exception):
    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"


def run_until_signal(
    start: Callable[[], None], poll: Callable[[], int | None], stop: Callable[[], None], what: str
) -> int:
    """Start, then wait until a process of ours exits or SIGTERM/SIGINT arrives; always stop everything.

    The wait polls: a signal handler that waited on a child while the main thread also waited on it
    would deadlock. A stop requested by one signal returns 128 + its number; a server that stopped on
    its own says so (SGLang takes all its processes down when one scheduler fails) and returns non-zero.
    """

    def on_signal(signum: int, _frame: object) -> None:
        raise _Stopped(signum)

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        start()
        while (code := poll()) is None:
            time.sleep(0.2)
        print(
            f"agentcache: {what} stopped on its own ({describe_exit(code)}). A failing scheduler takes every "
            "SGLang process down with it: the reason is in its log above.",
            file=sys.stderr,
        )
        return code if code > 0 else 128 - code if code < 0 else 1
    except _Stopped as stopped:
        print(f"agentcache: {signal.Signals(stopped.signum).name} received, stopping {what}", file=sys.stderr)
        return 128 + stopped.signum
    finally:
        for sig in previous:  # a second signal while stopping must not cut the stop short
            signal.signal(sig, signal.SIG_IGN)
        try:
            stop()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def serve_forever(opts: ServeOptions) -> int:
    """Run until SGLang exits or we get SIGINT/SIGTERM; then stop everything."""
    server = Server(opts)

    def start() -> None:
        server.start()
        print(
            f"agentcache: serving on {opts.base_url} (policy {opts.policy}, {'CPU' if opts.cpu_mode else 'GPU'} mode)",
            file=sys.stderr,
        )
        if not opts.operator_key:
            print(
                "agentcache: development mode: no --api-key, every client is the operator and may read and end"
                " every workflow",
                file=sys.stderr,
            )

    try:
        return run_until_signal(start, server.poll, server.stop, "the server")
    except ServerError as exc:
        print(f"agentcache: {exc}", file=sys.stderr)
        return 1
