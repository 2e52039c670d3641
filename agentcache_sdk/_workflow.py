"""Workflows: one per top-level run of the app, from the decorated call's entry to its exit.

The current workflow lives in a context variable, so it follows the app into
asyncio tasks and into threads started with the context copied (which is how
LangChain and AutoGen run their work), and the SDK carries it into work
submitted to a thread pool (`concurrent.futures` executors,
`loop.run_in_executor`, `asyncio.to_thread`). Leaving the decorated call,
normally or by an exception, sends the end event exactly once. A request made
after `end_workflow()` in the same call opens the call's next workflow
(`<id>.2`, `<id>.3`, ...), never the ended one, and leaving the call ends that
one too; a request made after the call returned (by a task or thread it left
running) is not tagged. A workflow that made no tagged request sends no end:
the server never saw it.

An unreachable server never breaks the app or holds up its exit: end events
go out from a background thread with a few retries; a server that refuses the
connection, does not accept it within CONNECT_TIMEOUT_S, or does not answer
within `end_timeout_s`, gets no retries, and further ends to it are dropped
for UNREACHABLE_COOLDOWN_S instead of queued (a circuit breaker: one hung
worker behind a router must not hold up the ends to the others); at most
MAX_PENDING_ENDS wait to be sent; at exit the SDK waits at most
`exit_timeout_s` for pending ends. Failures are warned about once, counted
(`stats()`), and otherwise ignored: a server ends a workflow whose end was
lost when its lease runs out.
"""

from __future__ import annotations

import atexit
import concurrent.futures
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

from agentcache.tags import MAX_ID_CHARS, check_id
from agentcache_sdk._workers import end_targets
from agentcache_sdk._config import settings

logger = logging.getLogger("agentcache_sdk")

F = TypeVar("F", bound=Callable[..., Any])

_current: contextvars.ContextVar[WorkflowContext | None] = contextvars.ContextVar("agentcache_workflow", default=None)
_agent_name: contextvars.ContextVar[str | None] = contextvars.ContextVar("agentcache_agent_name", default=None)

END_ATTEMPTS = 3
CONNECT_TIMEOUT_S = 1.0  # a live server accepts at once; a dead one must not cost end_timeout_s per attempt
UNREACHABLE_COOLDOWN_S = 10.0  # short: a server back from a restart gets ends again soon
MAX_PENDING_ENDS = 10_000  # a server that answers slowly must not grow the queue with every workflow the app runs
counters: Counter[str] = Counter()
end_observers: list[Callable[[str], None]] = []  # called with a workflow id when it ends (the recorder)
_warned: set[str] = set()
_lock = threading.Lock()


@dataclass
class WorkflowContext:
    """The workflow of one decorated call: its id, and the tagged requests (per agent) it made.

    A request after an end opens the call's next workflow in place: `id` becomes `<first id>.2` (then
    `.3`, ...), `ended` turns False, and `requests` and `agents` count again from zero. The threads and
    tasks of the call share this object; the lock keeps the switch atomic.
    """

    id: str
    name: str | None = None
    ended: bool = False
    requests: int = 0
    agents: Counter[str] = field(default_factory=Counter)
    # The credentials the workflow's requests carried: the server scopes workflows by them, so the
    # end event must carry the same ones to reach the same tenant.
    authorization: str | None = None
    _first_id: str = field(default="", init=False, repr=False)
    _started: int = field(default=1, init=False, repr=False)  # workflows the call has started
    _returned: bool = field(default=False, init=False, repr=False)  # the decorated call has returned
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._first_id = self.id

    def tag_request(self, agent: str) -> str | None:
        """The workflow id to tag one more request from `agent` with, counted; None once the call returned.

        The server would mark an ended workflow active again, with no end to come, so a request after
        an end opens the next workflow instead.
        """
        with self._lock:
            if self._returned:
                return None
            if self.ended:
                self._started += 1
                suffix = f".{self._started}"  # the first id cut where it must be, to stay a valid id
                self.id = self._first_id[: MAX_ID_CHARS - len(suffix)] + suffix
                self.ended, self.requests, self.agents = False, 0, Counter()
                _count("workflows")
            self.requests += 1
            self.agents[agent] += 1
            return self.id

    def _close(self, returned: bool) -> tuple[str, int] | None:
        """End the open workflow: (its id, its tagged requests), or None when none is open."""
        with self._lock:
            self._returned = self._returned or returned
            if self.ended:
                return None
            self.ended = True
            return self.id, self.requests


def current_workflow() -> WorkflowContext | None:
    """The workflow the caller runs in, or None outside any."""
    return _current.get()


def current_agent_name() -> str | None:
    """The framework's name for the agent now calling the LLM, when an integration knows it (a name that is not
    a non-empty string, `agent_name(7)` or a provider's slip, counts as none: it must not break the request)."""
    name = _agent_name.get()
    if isinstance(name, str) and name:
        return name
    for provider in _name_providers:
        try:
            name = provider()
        except Exception:  # an integration bug must not break the app's request
            name = None
        if isinstance(name, str) and name:
            return name
    return None


_name_providers: list[Callable[[], str | None]] = []
_start_hooks: list[Callable[[], object]] = []


def add_agent_name_provider(
    provider: Callable[[], str | None], on_workflow_start: Callable[[], object] | None = None
) -> None:
    """Integrations register a function that returns the framework's current agent name (or None).

    `on_workflow_start` runs whenever a workflow starts, before the app's code: an integration hooks
    into its framework there once the app has loaded the framework (the SDK never imports one).
    """
    if provider not in _name_providers:
        _name_providers.append(provider)
    if on_workflow_start is not None and on_workflow_start not in _start_hooks:
        _start_hooks.append(on_workflow_start)


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


def _count(key: str, n: int = 1) -> None:
    with _lock:
        counters[key] += n


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
    """Sends end events from a background thread, so leaving a workflow never waits on the server.

    A target that refuses the connection, does not accept it in time or does not answer in time is
    unreachable: the end to it is not retried, and for UNREACHABLE_COOLDOWN_S further ends to it are
    dropped rather than queued behind attempts that cannot succeed. The first end after the cool-down
    tries again.
    """

    def __init__(self) -> None:
        self._queue: queue.Queue[tuple[str, dict[str, str]]] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self._unreachable_until: dict[str, float] = {}

    def submit(self, workflow_id: str, headers: dict[str, str]) -> None:
        if self._unreachable(settings.base_url):
            _count("dropped_ends")
            return
        if self._queue.unfinished_tasks >= MAX_PENDING_ENDS:
            _count("dropped_ends")
            _warn_once(
                "end_backlog",
                f"agentcache: {MAX_PENDING_ENDS} workflow end events wait to be sent (the server answers slowly);"
                " further ones are dropped, counted in agentcache_sdk.stats()['dropped_ends']",
            )
            return
        with self._start_lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="agentcache-end-events", daemon=True)
                self._thread.start()
        self._queue.put((workflow_id, headers))

    def pending(self) -> int:
        return self._queue.unfinished_tasks

    def _unreachable(self, base_url: str) -> bool:
        return time.monotonic() < self._unreachable_until.get(base_url, 0.0)

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
        if self._unreachable(settings.base_url):  # found unreachable while this end waited
            _count("dropped_ends")
            return
        targets = end_targets(client, settings.base_url, headers)
        pending = [base_url for base_url in targets if not self._unreachable(base_url)]
        dropped = len(pending) < len(targets)
        timeout = httpx.Timeout(settings.end_timeout_s, connect=min(CONNECT_TIMEOUT_S, settings.end_timeout_s))
        for attempt in range(END_ATTEMPTS):
            failed = []
            for base_url in pending:
                try:
                    r = client.post(_end_url(base_url, workflow_id), headers=headers, timeout=timeout)
                    r.raise_for_status()
                except (httpx.ConnectError, httpx.TimeoutException) as exc:
                    self._trip(base_url, exc)
                    dropped = True
                except httpx.HTTPError as exc:
                    error = exc
                    failed.append(base_url)
            pending = failed
            if not pending or attempt + 1 == END_ATTEMPTS:
                break
            time.sleep(0.5 * (attempt + 1))
        if pending:
            _warn_once(
                "end_failures",
                f"agentcache: could not send the end of workflow {workflow_id} to {', '.join(pending)}: {error!r}",
            )
        else:
            _count("dropped_ends" if dropped else "ended")

    def _trip(self, base_url: str, error: httpx.HTTPError) -> None:
        self._unreachable_until[base_url] = time.monotonic() + UNREACHABLE_COOLDOWN_S
        _warn_once(
            "unreachable",
            f"agentcache: {base_url} is unreachable ({error!r}); end events to it are dropped for "
            f"{UNREACHABLE_COOLDOWN_S:g} s at a time, counted in agentcache_sdk.stats()['dropped_ends']",
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


def _wait_at_exit() -> None:
    """Give pending end events at most `exit_timeout_s`, so that an unreachable server never holds up the exit."""
    if not _sender.flush(settings.exit_timeout_s):
        _count("dropped_ends", _sender.pending())
    if counters["dropped_ends"]:
        logger.warning(
            "agentcache: %d workflow end events were dropped (the server was unreachable, or did not answer within "
            "the %g s exit wait); the server ends those workflows when their leases run out",
            counters["dropped_ends"],
            settings.exit_timeout_s,
        )


atexit.register(_wait_at_exit)


def _end(ctx: WorkflowContext, returned: bool) -> None:
    closed = ctx._close(returned)
    if closed is None:
        return
    workflow_id, requests = closed
    if not requests:
        _count("empty_workflows")  # the server never saw it: nothing to end there
        return
    for observer in list(end_observers):
        notify(observer, workflow_id)
    _sender.submit(workflow_id, _headers(ctx.authorization))


def notify(observer: Callable[..., object], *args: Any) -> None:
    """Hand an event to an observer (the recorder): one that fails (a full disk) must not fail the app's request
    or its workflow; counted, and said once."""
    try:
        observer(*args)
    except Exception as exc:
        logger.debug("agentcache: an observer failed", exc_info=True)
        _warn_once(
            "observer_failures",
            f"agentcache: an observer of the SDK's traffic (the trace recorder) failed ({exc!r}); the app went on,"
            " the event is missing from what it records; counted in agentcache_sdk.stats()['observer_failures']",
        )


STAT_KEYS = (
    "workflows",
    "ended",
    "empty_workflows",
    "dropped_ends",
    "end_failures",
    "unreachable",
    "tagging_failures",
    "observer_failures",
)


def stats() -> dict[str, int]:
    """The SDK's counters since the process started.

    workflows: workflows started (a request after an end starts one more); ended: end events the server
    acknowledged; empty_workflows: workflows ended without a tagged request, so without an end event;
    dropped_ends: end events not delivered, the server being unreachable or the exit wait over;
    end_failures: end events the server kept failing; unreachable: times a server was found unreachable;
    tagging_failures: requests sent untagged because tagging them failed (a bug); observer_failures: events an
    observer (the trace recorder) failed to take; pending_ends: end events not sent yet.
    """
    with _lock:
        return {**dict.fromkeys(STAT_KEYS, 0), **counters, "pending_ends": _sender.pending()}


def flush(timeout_s: float = 10.0) -> bool:
    """Wait for pending end events to reach the server (they are sent in the background)."""
    return _sender.flush(timeout_s)


def end_workflow() -> bool:
    """End the current workflow now (its cache becomes the first to go). False outside a workflow.

    A request made after this in the same decorated call starts the call's next workflow (`<id>.2`).
    """
    ctx = _current.get()
    if ctx is None:
        return False
    _end(ctx, returned=False)
    return True


class workflow:  # noqa: N801 - a decorator and context manager, spelled like one
    """Make each call of a function (sync or async), or each `with` block, one workflow.

        @workflow
        def run(task): ...

        @workflow(name="code-assistant")
        async def run(task): ...

        with workflow(name="batch") as wf: ...

    A workflow started inside another one joins it: one top-level run is one workflow. After
    `end_workflow()`, the call's next request starts its next workflow (`<id>.2`), which leaving ends.
    `workflow_id` and `name` are printable text of at most 256 characters, in any script (the wire format's
    ids, docs/design/wire-format.md); anything else raises ValueError here.
    """

    def __init__(
        self, fn: Callable[..., Any] | None = None, *, name: str | None = None, workflow_id: str | None = None
    ):
        # An id the server would refuse (its tags dropped, the request served untagged) or that cannot travel in a
        # header (a line break) is the caller's mistake: said here, where it is made, not at every request.
        if workflow_id:  # empty: one is made, as for None
            check_id("workflow_id", workflow_id)
        if name:
            check_id("name", name)
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
        if outer is not None and not outer._returned:
            self._scopes.append((None, outer))
            return outer
        for hook in list(_start_hooks):
            try:
                hook()
            except Exception:  # an integration bug must not break the app
                logger.debug("agentcache: a workflow start hook failed", exc_info=True)
        random_part = uuid.uuid4().hex[:16]
        prefix = f"{self.name[: MAX_ID_CHARS - len(random_part) - 1]}-" if self.name else "wf-"
        ctx = WorkflowContext(self.workflow_id or prefix + random_part, self.name)
        self._scopes.append((_current.set(ctx), ctx))
        _count("workflows")
        return ctx

    def __enter__(self) -> WorkflowContext:
        return self._open()

    def __exit__(self, *exc: object) -> None:
        token, ctx = self._scopes.pop()
        if token is not None:
            _current.reset(token)
            _end(ctx, returned=True)

    async def __aenter__(self) -> WorkflowContext:
        return self._open()

    async def __aexit__(self, *exc: object) -> None:
        token, ctx = self._scopes.pop()
        if token is not None:
            _current.reset(token)
            _end(ctx, returned=True)


# ---------------------------------------------------------------- thread pools

# Python 3.14's InterpreterPoolExecutor is a ThreadPoolExecutor whose tasks run in another interpreter,
# where a closure over this one's objects cannot go.
_INTERPRETER_POOL = getattr(concurrent.futures, "InterpreterPoolExecutor", ())


def carry_into_thread_pools() -> None:
    """Run work submitted to a thread pool from inside a workflow in that workflow, under the same agent name.

    Executor threads do not inherit context variables. As OpenTelemetry's threading instrumentation
    does for its context, this wraps `ThreadPoolExecutor.submit` (which `map`, `loop.run_in_executor`
    and `asyncio.to_thread` go through), carrying only the SDK's own variables and only inside a
    workflow. Idempotent (done when agentcache_sdk is imported).
    """
    submit = concurrent.futures.ThreadPoolExecutor.submit
    if getattr(submit, "carries_agentcache_workflow", False):
        return

    @functools.wraps(submit)
    def submit_in_workflow(self: Any, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        ctx = _current.get()
        if ctx is not None and not isinstance(self, _INTERPRETER_POOL):
            fn = _in_workflow(fn, ctx, _agent_name.get())
        return submit(self, fn, *args, **kwargs)

    submit_in_workflow.carries_agentcache_workflow = True  # type: ignore[attr-defined]
    concurrent.futures.ThreadPoolExecutor.submit = submit_in_workflow  # type: ignore[method-assign]


def _in_workflow(fn: Callable[..., Any], ctx: WorkflowContext, name: str | None) -> Callable[..., Any]:
    def run(*args: Any, **kwargs: Any) -> Any:
        # Set and reset in the worker thread's own context: the thread serves other work after this task.
        workflow_token, name_token = _current.set(ctx), _agent_name.set(name)
        try:
            return fn(*args, **kwargs)
        finally:
            _agent_name.reset(name_token)
            _current.reset(workflow_token)

    return run
