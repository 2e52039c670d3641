"""Hooking a framework once, never importing it: at the app's call, or when a workflow starts after the app
imported the framework."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable


class HookOnce:
    """Runs `hook` (which imports the framework and registers ours; False where it is not installed) at most
    once with success, whichever thread gets there first (workflows may start in several at once)."""

    def __init__(self, module: str, hook: Callable[[], bool]) -> None:
        self.module = module  # the framework's module whose presence in sys.modules says the app loaded it
        self._hook = hook
        self._done = False
        self._lock = threading.Lock()

    def install(self) -> bool:
        """Hook the framework, importing it (idempotent); False when it is not installed."""
        with self._lock:
            if not self._done:
                self._done = self._hook()
            return self._done

    def if_loaded(self) -> None:
        """Hook it once the app has imported it (never imports it)."""
        if not self._done and self.module in sys.modules:
            self.install()
