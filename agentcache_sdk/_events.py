"""Sending a workflow's end event to the server (or to every worker behind sglang-router), in the background.

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

httpx is imported by the sending thread, not with the SDK: a workflow has an
end to send only once one of its requests went out through httpx.
"""

from __future__ import annotations

import atexit
import queue
import threading
import time
from typing import TYPE_CHECKING
from urllib.parse import quote

from agentcache_sdk._config import settings
from agentcache_sdk._counters import count, counted, logger, warn_once
from agentcache_sdk._workers import end_targets

if TYPE_CHECKING:
    import httpx

END_ATTEMPTS = 3
CONNECT_TIMEOUT_S = 1.0  # a live server accepts at once; a dead one must not cost end_timeout_s per attempt
UNREACHABLE_COOLDOWN_S = 10.0  # short: a server back from a restart gets ends again soon
MAX_PENDING_ENDS = 10_000  # a server that answers slowly must not grow the queue with every workflow the app runs


def _end_url(base_url: str, workflow_id: str) -> str:
    return f"{base_url}/agentcache/v1/workflows/{quote(workflow_id, safe='')}/end"


def headers(authorization: str | None = None) -> dict[str, str]:
    """The end event's headers: the credentials the workflow's requests carried, else the configured key."""
    if authorization:
        return {"Authorization": authorization}
    return {"Authorization": f"Bearer {settings.api_key}"} if settings.api_key else {}


class EndSender:
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
            count("dropped_ends")
            return
        if self._queue.unfinished_tasks >= MAX_PENDING_ENDS:
            count("dropped_ends")
            warn_once(
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
        import httpx

        with httpx.Client() as client:
            while True:
                workflow_id, headers = self._queue.get()
                try:
                    self._post(client, workflow_id, headers)
                finally:
                    self._queue.task_done()

    def _post(self, client: httpx.Client, workflow_id: str, headers: dict[str, str]) -> None:
        """Send the end to the server, or behind sglang-router to every worker (the router has no such route)."""
        import httpx

        if self._unreachable(settings.base_url):  # found unreachable while this end waited
            count("dropped_ends")
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
            warn_once(
                "end_failures",
                f"agentcache: could not send the end of workflow {workflow_id} to {', '.join(pending)}: {error!r}",
            )
        else:
            count("dropped_ends" if dropped else "ended")

    def _trip(self, base_url: str, error: httpx.HTTPError) -> None:
        self._unreachable_until[base_url] = time.monotonic() + UNREACHABLE_COOLDOWN_S
        warn_once(
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


sender = EndSender()


def flush(timeout_s: float = 10.0) -> bool:
    """Wait for pending end events to reach the server (they are sent in the background)."""
    return sender.flush(timeout_s)


def _wait_at_exit() -> None:
    """Give pending end events at most `exit_timeout_s`, so that an unreachable server never holds up the exit."""
    if not sender.flush(settings.exit_timeout_s):
        count("dropped_ends", sender.pending())
    dropped = counted().get("dropped_ends", 0)
    if dropped:
        logger.warning(
            "agentcache: %d workflow end events were dropped (the server was unreachable, or did not answer within "
            "the %g s exit wait); the server ends those workflows when their leases run out",
            dropped,
            settings.exit_timeout_s,
        )


atexit.register(_wait_at_exit)
