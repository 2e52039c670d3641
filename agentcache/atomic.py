"""Files written whole or not at all: a reader (or a server starting) never meets a half-written one.

The content goes to a temporary file in the target's folder (the same file
system, so the rename is atomic), is flushed and fsynced, then renamed over
the target, and the folder fsynced so that the rename survives a crash too.
A kill at any point leaves either the old file or the new one, and at worst
a stray temporary file named ``.NAME.*.tmp`` beside them.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import IO, Any


@contextmanager
def atomic_write(path: str | Path, mode: str = "w", encoding: str | None = "utf-8") -> Iterator[IO[Any]]:
    """A file object whose content replaces `path` when the block ends without an exception (else `path` is
    left as it was). `mode` is "w" (text, in `encoding`) or "wb". A file replaced keeps its permissions; a new
    one gets the process's umask, as `open` would give it."""
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_write writes a whole file: mode 'w' or 'wb', not {mode!r}")
    target = Path(path)
    temporary = target.with_name(f".{target.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # the umask applies, as in `open`
    try:
        with open(fd, mode, encoding=None if mode == "wb" else encoding) as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        with suppress(FileNotFoundError):
            os.chmod(temporary, os.stat(target).st_mode & 0o7777)
        os.replace(temporary, target)
    except BaseException:
        with suppress(FileNotFoundError):
            os.unlink(temporary)
        raise
    _fsync_folder(target.parent)


def _fsync_folder(folder: Path) -> None:
    """Make a rename in `folder` durable (where the platform can open a folder at all)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some file systems refuse fsync on a folder; the rename itself is still atomic
    finally:
        os.close(fd)
