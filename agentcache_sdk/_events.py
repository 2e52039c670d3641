"""The SDK's one channel to the server's event routes, in the background: workflow ends and batched events.

Two kinds of item share one queue, in the order they happened: a workflow's
end (``POST /agentcache/v1/workflows/<id>/end``) and an event: an agent's
tool call starting or ending (agentcache_sdk._tools), the app's plan, the
agents its framework decided call next, an agent done (agentcache_sdk._plan); sent in batches of at most
MAX_BATCH_EVENTS to ``POST /agentcache/v1/events``: consecutive events with
the same credentials go in one body). Behind sglang-router, which has neither
route, each goes to every worker (agentcache_sdk._workers).

An unreachable server never breaks the app or holds up its exit: items go
out from a background thread with a few retries; a server that refuses the
connection, does not accept it within CONNECT_TIMEOUT_S, or does not answer
within `end_timeout_s`, gets no retries, and further items to it are dropped
for UNREACHABLE_COOLDOWN_S instead of queued (a circuit breaker: one hung
worker behind a router must not hold up the others); at most MAX_PENDING
wait to be sent; at exit the SDK waits at most `exit_timeout_s`. A server
that refuses a batch (4xx: an event it finds invalid, or an older server
without the events route) gets no retry; one over its event rate (429) has
the batch dropped. Failures are warned about once,
counted (`stats()`), and otherwise ignored: a server ends a workflow whose end
was lost when its lease runs out, and a lost tool event costs only what the
server would have kept for that pause.

httpx is imported by the sending thread, not with the SDK: a workflow has
something to send only once one of its requests went out through httpx.
"""

from __future__ import annotations

import atexit
import queue
import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from agentcache_sdk._config import settings
from agentcache_sdk._counters import count, counted, logger, warn_once
from agentcache_sdk._workers import end_targets

if TYPE_CHECKING:
    import httpx

ATTEMPTS = 3
CONNECT_TIMEOUT_S = 1.0  # a live server accepts at once; a dead one must not cost end_timeout_s per attempt
UNREACHABLE_COOLDOWN_S = 10.0  # short: a server back from a restart gets events again soon
MAX_PENDING = 10_000  # a server that answers slowly must not grow the queue with every workflow the app runs
MAX_BATCH_EVENTS = 256  # the events route takes 1..256 events per body
EVENTS_PATH = "/agentcache/v1/events"


def _end_url(base_url: str, workflow_id: str) -> str:
    return f"{base_url}/agentcache/v1/workflows/{quote(workflow_id, safe='')}/end"


def headers(authorization: str | None = None) -> dict[str, str]:
    """An item's headers: the credentials the workflow's requests carried (the server scopes workflows by them),
    else the configured key."""
    if authorization:
        return {"Authorization": authorization}
    return {"Authorization": f"Bearer {settings.api_key}"} if settings.api_key else {}


@dataclass(frozen=True)
class _End:
    workflow_id: str
    headers: dict[str, str]

    kind = "ends"


@dataclass(frozen=True)
class _Event:
    body: dict[str, Any]  # one element of the events route's `events` list
    headers: dict[str, str]

    kind = "events"


class EventSender:
    """Sends ends and events from a background thread, so the app never waits on the server.

    A target that refuses the connection, does not accept it in time or does not answer in time is
    unreachable: what was sent to it is not retried, and for UNREACHABLE_COOLDOWN_S further items to it
    are dropped rather than queued behind attempts that cannot succeed. The first item after the
    cool-down tries again.
    """

    def __init__(self) -> None:
        self._queue: queue.Queue[_End | _Event] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self._unreachable_until: dict[str, float] = {}
        self._pending: Counter[str] = Counter()  # "ends" / "events" submitted and not yet sent or given up
        self._pending_lock = threading.Lock()

    def submit_end(self, workflow_id: str, headers: dict[str, str]) -> None:
        self._submit(_End(workflow_id, headers))

    def submit_event(self, event: dict[str, Any], headers: dict[str, str]) -> None:
        """Queue one event (validated by the caller: the server refuses a whole batch for one bad event)."""
        self._submit(_Event(event, headers))

    def _submit(self, item: _End | _Event) -> None:
        if self._unreachable(settings.base_url):
            count(f"dropped_{item.kind}")
            return
        if self._queue.unfinished_tasks >= MAX_PENDING:
            count(f"dropped_{item.kind}")
            warn_once(
                "event_backlog",
                f"agentcache: {MAX_PENDING} workflow ends and events wait to be sent (the server answers slowly);"
                " further ones are dropped, counted in agentcache_sdk.stats()['dropped_ends'] and ['dropped_events']",
            )
            return
        with self._start_lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="agentcache-events", daemon=True)
                self._thread.start()
        with self._pending_lock:
            self._pending[item.kind] += 1
        self._queue.put(item)

    def pending(self, kind: str | None = None) -> int:
        """Items not sent yet: all of them, or the "ends" or the "events"."""
        if kind is None:
            return self._queue.unfinished_tasks
        with self._pending_lock:
            return self._pending[kind]

    def _unreachable(self, base_url: str) -> bool:
        return time.monotonic() < self._unreachable_until.get(base_url, 0.0)

    def _run(self) -> None:
        import httpx

        with httpx.Client() as client:
            while True:
                items = [self._queue.get()]
                while True:  # what else waits: consecutive events go out together
                    try:
                        items.append(self._queue.get_nowait())
                    except queue.Empty:
                        break
                try:
                    for run in _runs(items):
                        self._send(client, run)
                finally:
                    for item in items:
                        with self._pending_lock:
                            self._pending[item.kind] -= 1
                        self._queue.task_done()

    def _send(self, client: httpx.Client, run: list[_End] | list[_Event]) -> None:
        """Send one end, or one batch of events, to the server, or behind sglang-router to every worker."""
        import httpx

        first = run[0]
        kind, n = first.kind, len(run)
        if self._unreachable(settings.base_url):  # found unreachable while this waited
            count(f"dropped_{kind}", n)
            return
        if isinstance(first, _End):
            url_of, body = (lambda base_url: _end_url(base_url, first.workflow_id)), None
        else:
            url_of, body = (lambda base_url: base_url + EVENTS_PATH), {"events": [item.body for item in run]}
        targets = end_targets(client, settings.base_url, first.headers)
        pending = [base_url for base_url in targets if not self._unreachable(base_url)]
        dropped = len(pending) < len(targets)
        refused: httpx.Response | None = None
        timeout = httpx.Timeout(settings.end_timeout_s, connect=min(CONNECT_TIMEOUT_S, settings.end_timeout_s))
        for attempt in range(ATTEMPTS):
            failed = []
            for base_url in pending:
                try:
                    r = client.post(url_of(base_url), json=body, headers=first.headers, timeout=timeout)
                    if body is not None and r.status_code == 429:
                        dropped = True  # over the principal's event rate: shed, as the server asks
                        continue
                    if body is not None and 400 <= r.status_code < 500:
                        refused = r  # the same body would be refused again: no retry
                        continue
                    r.raise_for_status()
                except (httpx.ConnectError, httpx.TimeoutException) as exc:
                    self._trip(base_url, exc)
                    dropped = True
                except httpx.HTTPError as exc:
                    error = exc
                    failed.append(base_url)
            pending = failed
            if not pending or attempt + 1 == ATTEMPTS:
                break
            time.sleep(0.5 * (attempt + 1))
        if pending:
            what = f"the end of workflow {first.workflow_id}" if isinstance(first, _End) else f"{n} events"
            warn_once(
                f"{kind.removesuffix('s')}_failures",
                f"agentcache: could not send {what} to {', '.join(pending)}: {error!r}",
            )
        elif refused is not None:
            count("refused_events", n)
            warn_once(
                "refused_event_batches",
                f"agentcache: {refused.request.url} refused {n} events with HTTP {refused.status_code}"
                f" ({refused.text[:200]!r}); further refusals are counted in agentcache_sdk.stats()['refused_events']",
            )
        elif dropped:
            count(f"dropped_{kind}", n)
        else:
            count("ended" if kind == "ends" else "sent_events", n)

    def _trip(self, base_url: str, error: httpx.HTTPError) -> None:
        self._unreachable_until[base_url] = time.monotonic() + UNREACHABLE_COOLDOWN_S
        warn_once(
            "unreachable",
            f"agentcache: {base_url} is unreachable ({error!r}); workflow ends and events to it are dropped for "
            f"{UNREACHABLE_COOLDOWN_S:g} s at a time, counted in agentcache_sdk.stats()['dropped_ends'] and "
            "['dropped_events']",
        )

    def flush(self, timeout_s: float) -> bool:
        """Wait until everything submitted was sent or given up; False on timeout."""
        deadline = time.monotonic() + timeout_s
        while self._queue.unfinished_tasks:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True


def _runs(items: list[_End | _Event]) -> list[list[_End] | list[_Event]]:
    """`items` in order, cut into what goes out in one POST: an end alone; consecutive events with the same
    credentials together, at most MAX_BATCH_EVENTS."""
    runs: list[Any] = []
    for item in items:
        last = runs[-1] if runs else None
        if (
            isinstance(item, _Event)
            and last is not None
            and isinstance(last[0], _Event)
            and last[0].headers == item.headers
            and len(last) < MAX_BATCH_EVENTS
        ):
            last.append(item)
        else:
            runs.append([item])
    return runs


sender = EventSender()


def flush(timeout_s: float = 10.0) -> bool:
    """Wait for pending workflow ends and events to reach the server (they are sent in the background)."""
    return sender.flush(timeout_s)


def _wait_at_exit() -> None:
    """Give pending ends and events at most `exit_timeout_s`, so that an unreachable server never holds up the
    exit."""
    if not sender.flush(settings.exit_timeout_s):
        count("dropped_ends", sender.pending("ends"))
        count("dropped_events", sender.pending("events"))
    dropped = counted()
    if dropped.get("dropped_ends", 0):
        logger.warning(
            "agentcache: %d workflow end events were dropped (the server was unreachable, or did not answer within "
            "the %g s exit wait); the server ends those workflows when their leases run out",
            dropped["dropped_ends"],
            settings.exit_timeout_s,
        )
    if dropped.get("dropped_events", 0):
        logger.warning(
            "agentcache: %d events (tool calls, plans, decisions) were dropped (the server was unreachable, or did not answer within the %g s"
            " exit wait)",
            dropped["dropped_events"],
            settings.exit_timeout_s,
        )


atexit.register(_wait_at_exit)
