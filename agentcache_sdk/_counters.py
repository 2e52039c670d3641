"""The SDK's counters (`stats()`), its warnings (each said once, then only counted), and its observers' calls."""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

logger = logging.getLogger("agentcache_sdk")

counters: Counter[str] = Counter()
_warned: set[str] = set()
_lock = threading.Lock()


def count(key: str, n: int = 1) -> None:
    with _lock:
        counters[key] += n


def warn_once(key: str, message: str) -> None:
    with _lock:
        counters[key] += 1
        if key in _warned:
            return
        _warned.add(key)
    logger.warning("%s (further occurrences are only counted)", message)


def counted() -> dict[str, int]:
    """A copy of the counters, taken under their lock."""
    with _lock:
        return dict(counters)


def notify(observer: Callable[..., object], *args: Any) -> None:
    """Hand an event to an observer (the recorder): one that fails (a full disk) must not fail the app's request
    or its workflow; counted, and said once."""
    try:
        observer(*args)
    except Exception as exc:
        logger.debug("agentcache: an observer failed", exc_info=True)
        warn_once(
            "observer_failures",
            f"agentcache: an observer of the SDK's traffic (the trace recorder) failed ({exc!r}); the app went on,"
            " the event is missing from what it records; counted in agentcache_sdk.stats()['observer_failures']",
        )
