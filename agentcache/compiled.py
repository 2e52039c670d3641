"""The policy core compiled to C with mypyc, loaded only while it matches its sources.

pbkv's bookkeeping and its eviction heap run on SGLang's scheduler thread at every request and every eviction
round; SGLang compiles its own tree core (Rust) for the same reason. ``python -m agentcache.build_compiled``
(run by scripts/setup.sh) compiles the modules in :data:`MODULES` into ``agentcache/_compiled/`` with a manifest of
the sources they were built from. :func:`install` (run when agentcache is imported) puts a finder in front
of Python's own that serves those modules from the build, all of them or none: where the build is missing,
made for another Python, or any source changed since (an edit not yet rebuilt), every module is imported
from its source as if nothing had been built, and a build that is there but not used says why once.
``AGENTCACHE_PURE_PYTHON=1`` turns the compiled modules off (profiling, patching a method in a debugger).

The modules behave the same compiled or not (the test suite runs on whichever the machine has, CI on
the compiled one), with what mypyc changes: their classes have no ``__dict__`` and their methods cannot be
replaced on the class, and arguments are checked against their annotations at run time.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import sys
from dataclasses import dataclass
from enum import Enum
from importlib.abc import MetaPathFinder
from importlib.machinery import ModuleSpec
from pathlib import Path

logger = logging.getLogger("agentcache")

# Compiled together (mypyc calls across them natively): the policy core on the scheduler's hot path. Every
# class a module outside this list subclasses allows interpreted subclasses (mypyc_attr).
MODULES = (
    "agentcache.policy.workflows",
    "agentcache.policy.gaps",
    "agentcache.policy.pauses",
    "agentcache.policy.kept_key",
    "agentcache.policy.nodes",
    "agentcache.policy.base",
    "agentcache.policy.pbkv.ingredients",
    "agentcache.policy.pbkv.keys",
    "agentcache.policy.pbkv.timing",
    "agentcache.policy.pbkv.prior",
    "agentcache.policy.pbkv.forecasts",
    "agentcache.policy.pbkv.demand",
    "agentcache.policy.pbkv.hints",
    "agentcache.policy.pbkv.reuse",
    "agentcache.policy.pbkv.retired",
    "agentcache.policy.pbkv.score",
    "agentcache.policy.pbkv.policy",
    "agentcache.predictor.base",
    "agentcache.predictor.markov",
    "agentcache.predictor.guard",
    "agentcache.engine.heap",
)
GROUP = "agentcache_core"  # mypyc's shared library is the top-level module f"{GROUP}__mypyc"
SHARED_MODULE = f"{GROUP}__mypyc"
BUILD_DIR = Path(__file__).resolve().parent / "_compiled"
MANIFEST = "manifest.json"
PURE_ENV = "AGENTCACHE_PURE_PYTHON"


def package_dirs(package: str) -> list[Path]:
    """Where a package of agentcache's sources lies, found without importing it (nor its ``__init__``, which
    imports compiled modules): through the spec of its top package (``agentcache.policy``, ...), which knows
    where an editable install maps it, and its subpackages' folders below."""
    parts = package.split(".")
    top, below = ".".join(parts[:2]), parts[2:]
    spec = importlib.util.find_spec(top)
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(f"agentcache.compiled: package {top} not found")
    return [Path(location).joinpath(*below) for location in spec.submodule_search_locations]


def source_of(module: str) -> Path:
    """The source file of one of :data:`MODULES`, found without importing it."""
    package, _, name = module.rpartition(".")
    locations = package_dirs(package)
    for location in locations:
        path = location / f"{name}.py"
        if path.is_file():
            return path
    raise ImportError(f"agentcache.compiled: no source for {module} in {[str(p) for p in locations]}")


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


class Problem(Enum):
    """Why a build is not loaded. Every kind but NOT_BUILT (setup had no C compiler, or was not run) means a
    build is there that this process cannot use: the finder says so once."""

    NOT_BUILT = "not built"
    UNREADABLE = "unreadable"
    OTHER_PYTHON = "other python"
    OTHER_MODULES = "other modules"
    FILES_MISSING = "files missing"
    STALE = "stale"
    UNLOADABLE = "unloadable"


@dataclass
class Build:
    """What the build directory holds, and whether it may be loaded in this process."""

    directory: Path
    files: dict[str, Path]  # module name (the shared library's included) -> its compiled file
    problem: str | None  # why the build is not loaded, in words; None where it is
    kind: Problem | None = None  # the same, as a kind

    @classmethod
    def refused(cls, directory: Path, kind: Problem, problem: str) -> Build:
        """A build this process does not load: nothing of it is served."""
        return cls(directory, {}, problem, kind)

    @classmethod
    def read(cls, directory: Path = BUILD_DIR) -> Build:
        manifest_path = directory / MANIFEST
        if not manifest_path.is_file():
            return cls.refused(
                directory, Problem.NOT_BUILT, "not built (python -m agentcache.build_compiled builds it)"
            )
        try:
            manifest = json.loads(manifest_path.read_text())
            tag, modules = manifest["cache_tag"], manifest["modules"]
            files = {name: directory / entry["file"] for name, entry in modules.items()}
            files[SHARED_MODULE] = directory / manifest["shared"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            return cls.refused(directory, Problem.UNREADABLE, f"unreadable manifest {manifest_path}: {e}")
        if tag != sys.implementation.cache_tag:
            return cls.refused(
                directory, Problem.OTHER_PYTHON, f"built for {tag}, this is {sys.implementation.cache_tag}"
            )
        if set(modules) != set(MODULES):
            return cls.refused(
                directory,
                Problem.OTHER_MODULES,
                "built from another list of modules: rebuild (python -m agentcache.build_compiled)",
            )
        missing = [str(f) for f in files.values() if not f.is_file()]
        if missing:
            return cls.refused(directory, Problem.FILES_MISSING, f"files missing: {', '.join(missing)}")
        try:
            sources = {name: source_of(name) for name in modules}
            changed = [
                str(sources[name]) for name, entry in modules.items() if digest(sources[name]) != entry["source_sha256"]
            ]
        except (ImportError, OSError, KeyError, TypeError) as e:  # a source gone, or a manifest entry malformed
            return cls.refused(directory, Problem.UNREADABLE, f"sources not readable against {manifest_path}: {e}")
        if changed:
            return cls.refused(
                directory,
                Problem.STALE,
                f"stale: {', '.join(changed)} changed since the build (rebuild: python -m agentcache.build_compiled)",
            )
        return cls(directory, files, None)


class CompiledFinder(MetaPathFinder):
    """Serves the compiled modules of a fresh build; everything else (and everything, where the build may not
    be loaded) falls through to Python's own finders. The build is checked at the first import of one of its
    modules, so a process that never imports the policy core never reads it."""

    def __init__(self, directory: Path = BUILD_DIR):
        self.directory = directory
        self.build: Build | None = None

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> ModuleSpec | None:
        if fullname not in MODULES and fullname != SHARED_MODULE:
            return None
        if self.build is None:
            self.build = self._loaded(Build.read(self.directory))
        file = self.build.files.get(fullname)
        return importlib.util.spec_from_file_location(fullname, file) if file is not None else None

    @staticmethod
    def _loaded(build: Build) -> Build:
        """`build` with its shared library loaded, which holds every module's code (where it loads, each
        module's stub does), or with the reason it cannot be: then nothing of it is served."""
        if build.problem is None:
            try:
                spec = importlib.util.spec_from_file_location(SHARED_MODULE, build.files[SHARED_MODULE])
                assert spec is not None and spec.loader is not None
                library = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(library)
                sys.modules[SHARED_MODULE] = library
            except Exception as e:  # a damaged file, or one built against another runtime: never an import error
                build = Build.refused(build.directory, Problem.UNLOADABLE, f"unloadable: {e}")
        if build.kind is not None and build.kind is not Problem.NOT_BUILT:
            logger.warning("agentcache: not using the compiled policy core (%s); running it from source", build.problem)
        return build


def pure_requested() -> bool:
    return os.environ.get(PURE_ENV, "") not in ("", "0")


def install() -> None:
    """Put the finder in front of Python's own, once per process, unless AGENTCACHE_PURE_PYTHON is set."""
    if pure_requested() or any(isinstance(f, CompiledFinder) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, CompiledFinder())


def active() -> str:
    """How this process runs the policy core, in words (for statistics and benchmark headers)."""
    module = sys.modules.get("agentcache.policy.pbkv.policy")
    if module is not None and not str(getattr(module, "__file__", "")).endswith(".py"):
        return "compiled (mypyc)"
    if pure_requested():
        return f"pure Python ({PURE_ENV} is set)"
    finder = next((f for f in sys.meta_path if isinstance(f, CompiledFinder)), None)
    build = finder.build if finder is not None and finder.build is not None else Build.read()
    return f"pure Python ({build.problem})" if build.problem else "pure Python"
