"""Writing a workflow trace (format v1): every event validated as the reader would, files never truncated."""

from __future__ import annotations

import json
from pathlib import Path
from typing import IO, Any

from agentcache.atomic import atomic_write
from agentcache.trace.model import Event, Meta, Trace
from agentcache.trace.reader import LineParser, TraceError, torn


class TraceWriter:
    """Streams a trace to a file (or any text stream), one event per line, flushed as written.

    Events are validated exactly as the reader would, so a writer can never
    produce a trace its own reader rejects. A recording is never truncated
    unasked: a file that is not empty is refused (FileExistsError) unless
    `append`, which adds events after its own, validated as one trace with them
    (`meta` only goes into a new file; a torn last line is refused: appending
    would bury it mid-file).
    """

    def __init__(self, target: str | Path | IO[str], meta: Meta | None = None, *, append: bool = False):
        self._own = not hasattr(target, "write")
        self._source = str(target) if self._own else getattr(target, "name", "<stream>")
        self._parser = LineParser(self._source)
        self._line = 0
        self._fh: IO[str] = self._open(Path(target), append) if self._own else target  # type: ignore[arg-type]
        if meta is not None and not self._parser.seen_event:
            self._emit(meta.to_json())

    def _open(self, path: Path, append: bool) -> IO[str]:
        fh = open(path, "a+", encoding="utf-8")  # never truncates; creates a new file
        try:
            fh.seek(0)
            if fh.read(1) and not append:
                raise FileExistsError(
                    f"{path}: a trace is there already; a trace writer never overwrites one (append=True adds to"
                    " it; remove the file to start over)"
                )
            fh.seek(0)
            text = "\n"
            for self._line, text in enumerate(fh, start=1):
                if torn(text):  # only a last line can lack its newline
                    raise TraceError(self._source, self._line, None, "the last line is cut short; remove it to append")
                self._parser.parse(self._line, text)
            if not text.endswith("\n"):  # a last line whole but with no newline: the next event starts a line
                fh.write("\n")
        except BaseException:
            fh.close()
            raise
        return fh  # "a+": every write goes to the end

    @property
    def last_ts(self) -> float:
        """The latest event time written (or read, when appending): the next event's may not be earlier."""
        return self._parser.last_ts

    def _emit(self, obj: dict[str, Any]) -> None:
        text = json.dumps(obj, ensure_ascii=False)
        self._line += 1
        self._parser.parse(self._line, text)
        self._fh.write(text + "\n")
        self._fh.flush()

    def write(self, event: Event) -> None:
        self._emit(event.to_json())

    def close(self) -> None:
        if self._own:
            self._fh.close()

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def write_trace(path: str | Path, trace: Trace) -> None:
    """Write a whole trace to `path`, replacing what is there whole or not at all (atomic_write)."""
    with atomic_write(path) as fh, TraceWriter(fh, trace.meta) as writer:
        for event in trace.events:
            writer.write(event)
