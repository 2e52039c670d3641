"""A live bench's progress as it runs: which server starts, which policy and repetition, requests done, time left.

In a terminal, one status line redrawn in place (rich's Progress). Elsewhere (a CI log, `| tee`, nohup) plain
lines with no escape codes: one at every step of a run and one at least every `interval_s` while nothing
changes, so a long server start or a long run is never silence. Both go to the console given (the CLI's, on
stderr), so a command's table and --json line on stdout stay as they are.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable
from types import TracebackType

from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TaskID, TextColumn, TimeElapsedColumn

from agentcache.bench.runner import Stage

# A non-terminal output gets a line at least every 15 s: the ticker wakes once a second, and a busy machine may
# wake it late, so a line is due 13 s after the last.
PLAIN_INTERVAL_S = 13.0
REDRAW_S = 1.0  # how often the ticker wakes: the terminal's time left, the plain lines' interval


def duration(seconds: float) -> str:
    seconds = round(seconds)
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


class BenchProgress:
    """Hears `measure`'s stages and each answer, and shows where the bench is.

    `requests_per_run`: the requests every run sends, where known before the first run ends (the bench's trace);
    otherwise (the demo's apps branch as they go) the first finished run's count. Time left: the mean finished
    run's duration for each run to go; before any run has finished, from the share of this run's requests done.
    """

    def __init__(
        self,
        console: Console,
        *,
        requests_per_run: int | None = None,
        interval_s: float = PLAIN_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.console = console
        self.requests_per_run = requests_per_run
        self.interval_s = interval_s
        self.clock = clock
        self.started = clock()
        self._lock = threading.Lock()
        self._stage: Stage | None = None
        self._run_started = self.started
        self._running_since: float | None = None
        self._durations: list[float] = []  # finished runs'
        self._answers = 0  # this run's
        self._all_answers = 0
        self._last_line = float("-inf")
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None
        self._progress: Progress | None = None
        self._task: TaskID | None = None

    def stage(self, stage: Stage) -> None:
        with self._lock:
            now = self.clock()
            if self._stage is None or stage.run != self._stage.run:
                self._run_started, self._running_since, self._answers = now, None, 0
            if stage.step == "running":
                self._running_since = now
            if stage.step == "done":
                self._durations.append(now - self._run_started)
                if self.requests_per_run is None:
                    self.requests_per_run = self._answers
            self._stage = stage
            self._show(now, changed=True)

    def answered(self) -> None:
        with self._lock:
            self._answers += 1
            self._all_answers += 1

    def tick(self) -> None:
        """A line where the last is `interval_s` old (plain), or the status redrawn (terminal)."""
        with self._lock:
            self._show(self.clock(), changed=False)

    def time_left(self, now: float) -> float | None:
        stage = self._stage
        if stage is None:
            return None
        runs_after = stage.runs - stage.run - 1
        if self._durations:
            per_run = statistics.fmean(self._durations)
            this_run = 0.0 if stage.step == "done" else max(per_run - (now - self._run_started), 0.0)
            return this_run + per_run * runs_after
        if self._running_since is None or not self._answers or not self.requests_per_run:
            return None
        this_run = (now - self._running_since) * max(self.requests_per_run - self._answers, 0) / self._answers
        return this_run + (now - self._run_started + this_run) * runs_after

    def status(self, now: float) -> str:
        stage = self._stage
        if stage is None:
            return "getting the model ready"
        if stage.run < 0:  # before the first run: servers that start once for every run (the demo's)
            return f"{stage.step}; time left known after the first run"
        requests = f"{self._answers:,}" + (f" of {self.requests_per_run:,}" if self.requests_per_run else "")
        left = self.time_left(now)
        return (
            f"{stage.where}, run {stage.run + 1} of {stage.runs}: {stage.step}; {requests} requests done"
            f" ({self._all_answers:,} in all); "
            + (f"about {duration(left)} left" if left is not None else "time left known after the first run")
        )

    def _show(self, now: float, *, changed: bool) -> None:
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, description=self.status(now))
        elif not self.console.is_terminal and (changed or now - self._last_line >= self.interval_s):
            line = f"[{duration(now - self.started)}] {self.status(now)}"
            self.console.print(line, markup=False, highlight=False, soft_wrap=True)
            self._last_line = now

    def _tick_until_stopped(self) -> None:
        while not self._stop.wait(min(REDRAW_S, self.interval_s)):
            self.tick()

    def __enter__(self) -> BenchProgress:
        if self.console.is_terminal:
            self._progress = Progress(
                SpinnerColumn(),
                TimeElapsedColumn(),
                TextColumn("{task.description}"),
                console=self.console,
                transient=True,
            )
            self._progress.start()
            self._task = self._progress.add_task(self.status(self.clock()), total=None)
        else:
            self.tick()
        self._ticker = threading.Thread(target=self._tick_until_stopped, name="bench-progress", daemon=True)
        self._ticker.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join()
        if self._progress is not None:
            self._progress.stop()
