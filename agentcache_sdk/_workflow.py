"""Workflows: one per top-level run of the app, from the decorated call's entry to its exit.

The current workflow lives in a context variable, so it follows the app into
asyncio tasks and into threads started with the context copied (which is how
LangChain and AutoGen run their work). Leaving the decorated call, normally or
by an exception, sends the end event exactly once; an unreachable server
never breaks the app: end events go out from a background thread with a few
retries, and a failure is warned about once, counted, and otherwise ignored.
"""

from __future__ import annotations

import atexit
import contextvars
import functools
import inspect
import logging
import queue
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import quote

import httpx

from agentcache_sdk._cluster import end_targets
from agentcache_sdk._config import settings

logger = logging.getLogger("agentcache_sdk")

F = TypeVar("F", bound=Callable[..., Any])

_current: contextvars.ContextVar[WorkflowContext | None] = contextvars.ContextVar("agentcache_workflow", default=None)
_agent_name: contextvars.ContextVar[str | None] = contextvars.ContextVar("agentcache_agent_name", default=None)

END_ATTEMPTS = 3
counters: Counter[str] = Counter()
end_observers: list[Callable[[str], None]] = []  # called with a workflow id when it ends (the recorder)
_warned: set[str] = set()
_lock = threading.Lock()


@dataclass
class WorkflowContext:
    id: str
    name: str | None = None
    ended: bool = False
    requests: int = 0
    agents: Counter[str] = field(default_factory=Counter)
    # The credentials the workflow's requests carried: the server scopes workflows by them, so the
    # end event must carry the same ones to reach the same tenant.
    authorization: str | None = None


def current_workflow() -> WorkflowContext | None:
    """The workflow the caller runs in, or None outside any."""
    return _current.get()


def current_agent_name() -> str | None:
    """The framework's name for the agent now calling the LLM, when an integration knows it."""
    name = _agent_name.get()
    if name is not None:
        return name
    for provider in _name_providers:
        try:
            name = provider()
        except Exception:  # an integration bug must not break the app's request
            name = None
        if name:
            return name
    return None


_name_providers: list[Callable[[], str | None]] = []


def add_agent_name_provider(provider: Callable[[], str | None]) -> None:
    """Integrations register a function that returns the framework's current agent name (or None)."""
    if provider not in _name_providers:
        _name_providers.append(provider)


class agent_name:  # noqa: N801 - used like a function: `with agent_name("coder"): ...`
    """Name the agent for the requests made inside the block (when no integration can tell)."""

    def __init__(self, name: str):
        self.name = name
        self._token: contextvars.Token | None = None

    def __enter__(self) -> agent_name:
        self._token = _agent_name.set(self.name)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._token is not None:
            _agent_name.reset(self._token)


def _warn_once(key: str, message: str) -> None:
    with _lock:
        counters[key] += 1
        if key in _warned:
            return
        _warned.add(key)
    logger.warning("%s (further occurrences are only counted)", message)


def _end_url(base_url: str, workflow_id: str) -> str:
    return f"{base_url}/agentcache/v1/workflows/{quote(workflow_id, safe='')}/end"


def _headers(authorization: str | None = None) -> dict[str, str]:
    if authorization:
        return {"Authorization": authorization}
    return {"Authorization": f"Bearer {settings.api_key}"} if settings.api_key else {}


class _EndSender:
    """Sends end events from a background thread, so leaving a workflow never waits on the server."""

    def __init__(self) -> None:
        self._queue: queue.Queue[tuple[str, dict[str, str]]] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()

    def submit(self, ctx: WorkflowContext) -> None:
        if ctx.ended:
            return
        ctx.ended = True
        for observer in list(end_observers):
            observer(ctx.id)
        with self._start_lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="agentcache-end-events", daemon=True)
                self._thread.start()
        self._queue.put((ctx.id, _headers(ctx.authorization)))

    def _run(self) -> None:
        with httpx.Client() as client:
            while True:
                workflow_id, headers = self._queue.get()
                try:
                    self._post(client, workflow_id, headers)
                finally:
                    self._queue.task_done()

    def _post(self, client: httpx.Client, workflow_id: str, headers: dict[str, str]) -> None:
        """Send the end to the server, or behind sglang-router to every worker (the router has no such route)."""
        pending = end_targets(client, settings.base_url, headers)
        for attempt in range(END_ATTEMPTS):
            failed = []
            for base_url in pending:
                try:
                    r = client.post(_end_url(base_url, workflow_id), headers=headers, timeout=settings.end_timeout_s)
                    r.raise_for_status()
                except httpx.HTTPError as exc:
                    error = exc
                    failed.append(base_url)
            if not failed:
                counters["ended"] += 1
                return
            pending = failed
            time.sleep(0.5 * (attempt + 1))
        _warn_once(
            "end_failures",
            f"agentcache: could not send the end of workflow {workflow_id} to {', '.join(pending)}: {error!r}",
        )

    def flush(self, timeout_s: float) -> bool:
        """Wait until every submitted end event was sent or given up; False on timeout."""
        deadline = time.monotonic() + timeout_s
        while self._queue.unfinished_tasks:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True


_sender = _EndSender()
atexit.register(lambda: _sender.flush(settings.end_timeout_s * END_ATTEMPTS))


def flush(timeout_s: float = 10.0) -> bool:
    """Wait for pending end events to reach the server (they are sent in the background)."""
    return _sender.flush(timeout_s)


def end_workflow() -> bool:
    """End the current workflow now (its cache becomes the first to go). False outside a workflow."""
    ctx = _current.get()
    if ctx is None:
        return False
    _sender.submit(ctx)
    return True


class workflow:  # noqa: N801 - a decorator and context manager, spelled like one
    """Make each call of a function (sync or async), or each `with` block, one workflow.

        @workflow
        def run(task): ...

        @workflow(name="code-assistant")
        async def run(task): ...

        with workflow(name="batch") as wf: ...

    A workflow started inside another one joins it: one top-level run is one workflow.
    """

    def __init__(
        self, fn: Callable[..., Any] | None = None, *, name: str | None = None, workflow_id: str | None = None
    ):
        self.name = name
        self.workflow_id = workflow_id
        self._fn = fn
        self._scopes: list[tuple[contextvars.Token | None, WorkflowContext]] = []
        if fn is not None:
            functools.update_wrapper(self, fn)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self._fn is None:  # @workflow(name=...) applied to a function
            (fn,) = args
            return workflow(fn, name=self.name, workflow_id=self.workflow_id)
        fn = self._fn
        if inspect.iscoroutinefunction(fn):
            return self._call_async(fn, args, kwargs)
        with workflow(name=self.name, workflow_id=self.workflow_id):
            return fn(*args, **kwargs)

    async def _call_async(self, fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        async with workflow(name=self.name, workflow_id=self.workflow_id):
            return await fn(*args, **kwargs)

    def __get__(self, obj: Any, objtype: Any = None) -> Any:  # decorating methods
        if obj is None or self._fn is None:
            return self
        return functools.partial(self.__call__, obj)

    # -- scopes

    def _open(self) -> WorkflowContext:
        outer = _current.get()
        if outer is not None:
            self._scopes.append((None, outer))
            return outer
        prefix = f"{self.name}-" if self.name else "wf-"
        ctx = WorkflowContext(self.workflow_id or prefix + uuid.uuid4().hex[:16], self.name)
        self._scopes.append((_current.set(ctx), ctx))
        counters["workflows"] += 1
        return ctx

    def __enter__(self) -> WorkflowContext:
        return self._open()

    def __exit__(self, *exc: object) -> None:
        token, ctx = self._scopes.pop()
        if token is not None:
            _current.reset(token)
            _sender.submit(ctx)

    async def __aenter__(self) -> WorkflowContext:
        return self._open()

    async def __aexit__(self, *exc: object) -> None:
        token, ctx = self._scopes.pop()
        if token is not None:
            _current.reset(token)
            _sender.submit(ctx)
