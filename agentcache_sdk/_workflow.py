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
the server never saw it. The end events go out in the background
(agentcache_sdk._events). A workflow's end closes its agents' open tool pauses
(agentcache_sdk._tools) without an event: the server drops them with the workflow.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import threading
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from agentcache.tags import MAX_ID_CHARS, check_id
from agentcache_sdk._counters import count, counted, logger, notify
from agentcache_sdk._events import headers, sender

F = TypeVar("F", bound=Callable[..., Any])

workflow_var: contextvars.ContextVar[WorkflowContext | None] = contextvars.ContextVar(
    "agentcache_workflow", default=None
)
agent_name_var: contextvars.ContextVar[str | None] = contextvars.ContextVar("agentcache_agent_name", default=None)

end_observers: list[Callable[[str], None]] = []  # called with a workflow id when it ends (the recorder)


@dataclass
class WorkflowContext:
    """The workflow of one decorated call: its id, and the tagged requests (per agent) it made.

    A request after an end opens the call's next workflow in place: `id` becomes `<first id>.2` (then
    `.3`, ...), `ended` turns False, and `requests` and `agents` count again from zero. The threads and
    tasks of the call share this object; the lock keeps the switch atomic.
    """

    id: str
    name: str | None = None
    app: str | None = None  # what its requests' tags name as their app (plans and forecasts are per app)
    ended: bool = False
    requests: int = 0
    agents: Counter[str] = field(default_factory=Counter)
    # The credentials the workflow's requests carried: the server scopes workflows by them, so the
    # end event must carry the same ones to reach the same tenant.
    authorization: str | None = None
    last_agent: str | None = None  # the agent of its latest tagged request: a tool's caller when none is named
    # Its agents' open tool pauses (agentcache_sdk._tools keeps them, under `_lock`).
    pauses: list[Any] = field(default_factory=list, repr=False, compare=False)
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
                count("workflows")
            self.requests += 1
            self.agents[agent] += 1
            self.last_agent = agent
            return self.id

    def _close(self, returned: bool) -> tuple[str, int] | None:
        """End the open workflow: (its id, its tagged requests), or None when none is open."""
        with self._lock:
            self._returned = self._returned or returned
            if self.ended:
                return None
            self.ended = True
            self.pauses.clear()  # the server drops a workflow's pauses with it: no tool_end to send
            self.last_agent = None
            return self.id, self.requests


def as_id(name: str | None) -> str | None:
    """A name a framework or the app gave (an agent's, a tool's), cut to a valid id: its printable characters, at
    most MAX_ID_CHARS (a control character would get the request's tags, or a tool event, refused); None when
    nothing is left."""
    if not isinstance(name, str):
        return None
    return "".join(c for c in name if c.isprintable())[:MAX_ID_CHARS] or None


def _app_of(fn: Callable[..., Any]) -> str | None:
    """A decorated function's app: its qualified name (`module.qualname`), cut to a valid id."""
    qualname = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None)
    module = getattr(fn, "__module__", None)
    return as_id(f"{module}.{qualname}" if module and qualname else qualname)


def current_workflow() -> WorkflowContext | None:
    """The workflow the caller runs in, or None outside any."""
    return workflow_var.get()


def known_workflow() -> WorkflowContext | None:
    """The current workflow, when the server knows it (it has made a tagged request and is not ended): events
    about any other would name a workflow the server has not seen."""
    ctx = workflow_var.get()
    if ctx is None or ctx._returned or ctx.ended or not ctx.requests:
        return None
    return ctx


def current_agent_name() -> str | None:
    """The framework's name for the agent now calling the LLM, when an integration knows it (a name that is not
    a non-empty string, `agent_name(7)` or a provider's slip, counts as none: it must not break the request)."""
    name = agent_name_var.get()
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
        self._token = agent_name_var.set(self.name)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._token is not None:
            agent_name_var.reset(self._token)


def _end(ctx: WorkflowContext, returned: bool) -> None:
    closed = ctx._close(returned)
    if closed is None:
        return
    workflow_id, requests = closed
    if not requests:
        count("empty_workflows")  # the server never saw it: nothing to end there
        return
    for observer in list(end_observers):
        notify(observer, workflow_id)
    sender.submit_end(workflow_id, headers(ctx.authorization))


STAT_KEYS = (
    "workflows",
    "ended",
    "empty_workflows",
    "dropped_ends",
    "end_failures",
    "unreachable",
    "tagging_failures",
    "observer_failures",
    "sent_events",
    "dropped_events",
    "refused_events",
    "invalid_events",
    "event_failures",
)


def stats() -> dict[str, int]:
    """The SDK's counters since the process started.

    workflows: workflows started (a request after an end starts one more); ended: end events the server
    acknowledged; empty_workflows: workflows ended without a tagged request, so without an end event;
    dropped_ends: end events not delivered, the server being unreachable or the exit wait over;
    end_failures: end events the server kept failing; unreachable: times a server was found unreachable;
    tagging_failures: requests sent untagged because tagging them failed (a bug); observer_failures: events an
    observer (the trace recorder) failed to take; pending_ends: end events not sent yet.
    Tool events (agentcache_sdk._tools): sent_events: events the server took; dropped_events: not delivered (the
    server unreachable, the exit wait over, the queue full); refused_events: refused by the server (HTTP 4xx: an
    older server without the events route); invalid_events: never sent, their fields breaking the server's
    rules; event_failures: batches the server kept failing; pending_events: not sent yet.
    """
    return {
        **dict.fromkeys(STAT_KEYS, 0),
        **counted(),
        "pending_ends": sender.pending("ends"),
        "pending_events": sender.pending("events"),
    }


def end_workflow() -> bool:
    """End the current workflow now (its cache becomes the first to go). False outside a workflow.

    A request made after this in the same decorated call starts the call's next workflow (`<id>.2`).
    """
    ctx = workflow_var.get()
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

    Every request is tagged with the workflow's app: `app`, else `name`, else the decorated function's
    qualified name (`module.qualname`); a `with` block without either has none. An app's plan
    (agentcache_sdk._plan) is sent once per app and forecasts are kept per app, so one app is one kind of run.

    A workflow started inside another one joins it: one top-level run is one workflow. After
    `end_workflow()`, the call's next request starts its next workflow (`<id>.2`), which leaving ends.
    `workflow_id` and `name` are printable text of at most 256 characters, in any script (the wire format's
    ids, docs/design/wire-format.md); anything else raises ValueError here.
    """

    def __init__(
        self,
        fn: Callable[..., Any] | None = None,
        *,
        name: str | None = None,
        workflow_id: str | None = None,
        app: str | None = None,
    ):
        # An id the server would refuse (its tags dropped, the request served untagged) or that cannot travel in a
        # header (a line break) is the caller's mistake: said here, where it is made, not at every request.
        if workflow_id:  # empty: one is made, as for None
            check_id("workflow_id", workflow_id)
        if name:
            check_id("name", name)
        if app:
            check_id("app", app)
        self.name = name
        self.workflow_id = workflow_id
        self.app = app
        self._fn = fn
        self._scopes: list[tuple[contextvars.Token | None, WorkflowContext]] = []
        if fn is not None:
            functools.update_wrapper(self, fn)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self._fn is None:  # @workflow(name=...) applied to a function
            (fn,) = args
            return workflow(fn, name=self.name, workflow_id=self.workflow_id, app=self.app)
        fn = self._fn
        scope = workflow(name=self.name, workflow_id=self.workflow_id, app=self.app or self.name or _app_of(fn))
        if inspect.iscoroutinefunction(fn):
            return self._call_async(scope, fn, args, kwargs)
        with scope:
            return fn(*args, **kwargs)

    @staticmethod
    async def _call_async(scope: workflow, fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        async with scope:
            return await fn(*args, **kwargs)

    def __get__(self, obj: Any, objtype: Any = None) -> Any:  # decorating methods
        if obj is None or self._fn is None:
            return self
        return functools.partial(self.__call__, obj)

    # -- scopes

    def _open(self) -> WorkflowContext:
        outer = workflow_var.get()
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
        ctx = WorkflowContext(self.workflow_id or prefix + random_part, self.name, self.app or self.name)
        self._scopes.append((workflow_var.set(ctx), ctx))
        count("workflows")
        return ctx

    def __enter__(self) -> WorkflowContext:
        return self._open()

    def __exit__(self, *exc: object) -> None:
        token, ctx = self._scopes.pop()
        if token is not None:
            workflow_var.reset(token)
            _end(ctx, returned=True)

    async def __aenter__(self) -> WorkflowContext:
        return self._open()

    async def __aexit__(self, *exc: object) -> None:
        token, ctx = self._scopes.pop()
        if token is not None:
            workflow_var.reset(token)
            _end(ctx, returned=True)
