"""The code's shape (docs/architecture.md): layers that never import upwards, no import cycle, small modules.

Read from the sources with ast, so a violation fails here before anyone imports it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# import name -> folder, as pyproject.toml's package-dir maps them
PACKAGES = {
    "agentcache": ROOT / "agentcache",
    "agentcache.server_ext": ROOT / "server_ext",
    "agentcache.predictor": ROOT / "predictor",
    "agentcache.integrations": ROOT / "integrations",
    "agentcache_sdk": ROOT / "agentcache_sdk",
}
MAX_LINES = 400
SIZED = ("agentcache", "agentcache.server_ext", "agentcache.predictor", "agentcache_sdk")


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for package, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            relative = path.relative_to(folder)
            if relative.parts[0] in ("_compiled", "shims", "__pycache__"):
                continue
            parts = [p for p in relative.with_suffix("").parts if p != "__init__"]
            found[".".join([package, *parts])] = path
    return found


MODULES = _modules()


def _imports(path: Path, top_level_only: bool) -> set[str]:
    """Modules `path` imports (a `from package import submodule` counts as the submodule alone)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    if top_level_only:
        # module level, including under if/try (TYPE_CHECKING blocks too), not inside functions
        nodes = [
            n
            for top in tree.body
            if not isinstance(top, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
            for n in ast.walk(top)
        ]
    else:
        nodes = list(ast.walk(tree))
    names: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            submodules = [f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in MODULES]
            names.update(submodules)
            if len(submodules) < len(node.names):
                names.add(node.module)
    return names


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def test_no_import_cycle():
    graph = {name: {m for m in _imports(path, True) if m in MODULES and m != name} for name, path in MODULES.items()}
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_module_over_400_lines():
    sizes = {
        name: len(path.read_text(encoding="utf-8").splitlines())
        for name, path in MODULES.items()
        if name.split(".")[0] in SIZED or name.startswith(SIZED)
    }
    assert {name: n for name, n in sizes.items() if n > MAX_LINES} == {}


def _importers_of(forbidden: tuple[str, ...], within: str, top_level_only: bool = False) -> dict[str, list[str]]:
    bad: dict[str, list[str]] = {}
    for name, path in MODULES.items():
        if name != within and not name.startswith(within + "."):
            continue
        hits = sorted(m for m in _imports(path, top_level_only) if m.startswith(forbidden))
        if hits:
            bad[name] = hits
    return bad


@pytest.mark.parametrize(
    ("layer", "forbidden"),
    [
        # the policy core: plain Python, no engine, no framework
        (
            "agentcache.policy",
            (
                "sglang",
                "torch",
                "agentcache.engine",
                "agentcache.server_ext",
                "agentcache.replay",
                "agentcache.integrations",
                "agentcache_sdk",
                "agentcache.cli",
                "rich",
            ),
        ),
        # the engine layer adapts the policy to SGLang; it knows neither the server's process nor the replay
        ("agentcache.engine", ("agentcache.server_ext", "agentcache.replay", "agentcache.cli", "agentcache_sdk")),
        # the replay runs the engine layer, not the server plugin
        ("agentcache.replay", ("agentcache.server_ext", "agentcache.cli", "agentcache_sdk", "agentcache.integrations")),
        # the SDK needs httpx alone
        (
            "agentcache_sdk",
            (
                "agentcache.policy",
                "agentcache.engine",
                "agentcache.replay",
                "agentcache.server_ext",
                "agentcache.cli",
                "agentcache.predictor",
                "sglang",
                "torch",
                "rich",
                "numpy",
            ),
        ),
        ("agentcache.predictor", ("agentcache.server_ext", "agentcache.replay", "agentcache.cli", "agentcache_sdk")),
    ],
)
def test_layers_never_import_upwards(layer: str, forbidden: tuple[str, ...]):
    assert _importers_of(forbidden, layer) == {}


def test_computing_never_imports_presenting():
    presenting = ("agentcache.replay.report", "rich", "matplotlib")
    computing = [n for n in MODULES if n.startswith("agentcache.replay.") and n != "agentcache.replay.report"]
    bad = {n: sorted(m for m in _imports(MODULES[n], False) if m.startswith(presenting)) for n in computing}
    assert {n: hits for n, hits in bad.items() if hits} == {}


def test_benchmarks_import_no_cli_module():
    bad = {}
    for path in sorted((ROOT / "benchmarks").rglob("*.py")):
        hits = sorted(m for m in _imports(path, False) if m.startswith(("agentcache.cli", "agentcache.predictor.cli")))
        if hits:
            bad[path.name] = hits
    assert bad == {}
