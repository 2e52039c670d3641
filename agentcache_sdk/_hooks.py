"""Installing the request hooks on httpx and on the openai SDK, when the app imports them.

The SDK imports neither library: importing openai costs an app most of a
second, and httpx imports its command line's `rich` wherever that is
installed. Each hook is installed the moment its library has been imported,
by whoever imports it (the app, a framework, openai importing httpx), or at
once where it already was. This is a post-import hook, as wrapt's and
ddtrace's are: a finder first on ``sys.meta_path`` that, for a watched module
not imported yet, lets the other finders find it and runs the hook right after
the module's own code, inside the import, before anyone can use the module.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from importlib.abc import Loader, MetaPathFinder
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any

from agentcache_sdk import _routing
from agentcache_sdk._counters import logger
from agentcache_sdk._workflow import end_observers


def _hook_httpx() -> None:
    from agentcache_sdk import _httpx_hook

    _httpx_hook.install()


def _hook_openai() -> None:
    from agentcache_sdk import _openai_hook

    _openai_hook.install()


HOOKS: dict[str, Callable[[], None]] = {"httpx": _hook_httpx, "openai": _hook_openai}
_pending: dict[str, Callable[[], None]] = {}  # module name -> its hook, not run yet
_lock = threading.Lock()


def _run(name: str) -> None:
    """Run `name`'s hook unless it ran already; a hook that fails leaves that library's requests untagged."""
    with _lock:
        hook = _pending.pop(name, None)
    if hook is None:
        return
    try:
        hook()
    except ImportError:  # an openai without the private client module the hook patches: its requests go via httpx
        logger.debug("agentcache: could not hook %s", name, exc_info=True)
    except Exception:
        logger.warning("agentcache: could not hook %s; its requests are not tagged", name, exc_info=True)


class _HookAfterLoad(Loader):
    """A module's own loader, and its hook right after the module's code ran."""

    def __init__(self, loader: Loader, name: str):
        self.loader, self.name = loader, name

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        module.__loader__ = self.loader  # the module sees its own loader, as without the hook
        if module.__spec__ is not None:
            module.__spec__.loader = self.loader
        self.loader.exec_module(module)
        _run(self.name)

    def __getattr__(self, attribute: str) -> Any:  # get_resource_reader, is_package, ...: the module's loader's
        return getattr(self.loader, attribute)


class _PostImportFinder(MetaPathFinder):
    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> ModuleSpec | None:
        if fullname not in _pending:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _HookAfterLoad(spec.loader, fullname)
                return spec
        return None


def install() -> None:
    """Hook httpx and openai now where imported, else as they are (done when agentcache_sdk is imported)."""
    with _lock:
        if any(isinstance(finder, _PostImportFinder) for finder in sys.meta_path):
            return
        _pending.update(HOOKS)
        sys.meta_path.insert(0, _PostImportFinder())  # before the check below: an import meanwhile is hooked
    for name in HOOKS:
        if name in sys.modules:
            _run(name)
    if _routing.forget not in end_observers:
        end_observers.append(_routing.forget)
