"""The compiled policy core (agentcache.compiled): loaded only while it matches its sources, all of it or none."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from agentcache import compiled
from agentcache.compiled import BUILD_DIR, MANIFEST, MODULES, PURE_ENV, Build, CompiledFinder, Problem

BUILT = Build.read()


def module_files(env: dict[str, str]) -> dict[str, str]:
    """Where a fresh interpreter imports each compiled module from, and what it says it runs."""
    code = (
        "import importlib, json\n"
        "from agentcache import compiled\n"
        f"files = {{m: importlib.import_module(m).__file__ for m in {list(MODULES)!r}}}\n"
        "print(json.dumps({'files': files, 'active': compiled.active()}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120, check=True)
    return json.loads(out.stdout.splitlines()[-1])


@pytest.mark.skipif(BUILT.kind is Problem.NOT_BUILT, reason=str(BUILT.problem))
def test_where_setup_built_the_core_every_module_of_it_runs_compiled_and_the_switch_turns_it_off():
    """scripts/setup.sh builds it (CI's install included). A build older than its sources is reported as such: run
    `python -m agentcache.build_compiled` after editing one of agentcache.compiled.MODULES."""
    assert BUILT.problem is None, BUILT.problem
    env = {k: v for k, v in os.environ.items() if k != PURE_ENV}
    found = module_files(env)
    assert found["active"] == "compiled (mypyc)"
    finder = CompiledFinder()
    assert finder.find_spec("agentcache.policy.lru") is None  # not compiled: Python's own finders
    assert finder.find_spec("json") is None
    assert all(Path(f).is_relative_to(BUILD_DIR) and not f.endswith(".py") for f in found["files"].values()), found
    pure = module_files({**env, PURE_ENV: "1"})
    assert pure["active"] == f"pure Python ({PURE_ENV} is set)"
    assert all(f.endswith(".py") for f in pure["files"].values()), pure


def write_build(directory: Path, **changes: object) -> Path:
    """A build directory whose manifest names every module with its current source's digest, then `changes`."""
    directory.mkdir(parents=True, exist_ok=True)
    modules = {}
    for name in MODULES:
        file = directory / f"{name}.so"
        file.write_bytes(b"")
        modules[name] = {"file": file.name, "source_sha256": compiled.digest(compiled.source_of(name))}
    (directory / f"{compiled.SHARED_MODULE}.so").write_bytes(b"")
    manifest = {"cache_tag": sys.implementation.cache_tag, "shared": f"{compiled.SHARED_MODULE}.so", "modules": modules}
    manifest.update(changes)
    (directory / MANIFEST).write_text(json.dumps(manifest))
    return directory


def test_a_build_whose_library_does_not_load_is_not_served_and_says_why_once(tmp_path, caplog):
    """Matching every source, but its files damaged (here empty) or built against another runtime: an import of
    the policy core must not fail for it."""
    finder = CompiledFinder(write_build(tmp_path))
    with caplog.at_level(logging.WARNING, logger="agentcache"):
        assert [finder.find_spec(name) for name in MODULES] == [None] * len(MODULES)
    assert finder.build is not None and str(finder.build.problem).startswith("unloadable")
    warnings = [r.getMessage() for r in caplog.records if "compiled policy core (unloadable" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert compiled.SHARED_MODULE not in sys.modules or sys.modules[compiled.SHARED_MODULE].__file__ != str(
        tmp_path / f"{compiled.SHARED_MODULE}.so"
    )


def test_a_build_older_than_one_source_is_not_loaded_at_all_and_says_which_source_once(tmp_path, caplog):
    """An edit not rebuilt yet: loading the other modules compiled would mix code built against the old one."""
    manifest_path = write_build(tmp_path) / MANIFEST
    manifest = json.loads(manifest_path.read_text())
    manifest["modules"]["agentcache.predictor.markov"]["source_sha256"] = "0" * 64
    manifest_path.write_text(json.dumps(manifest))
    finder = CompiledFinder(tmp_path)
    with caplog.at_level(logging.WARNING, logger="agentcache"):
        assert [finder.find_spec(name) for name in MODULES] == [None] * len(MODULES)
    assert finder.build is not None and finder.build.problem is not None
    assert "markov.py changed since the build" in finder.build.problem
    warnings = [r.getMessage() for r in caplog.records if "compiled policy core" in r.getMessage()]
    assert len(warnings) == 1 and "running it from source" in warnings[0], warnings


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"cache_tag": "cpython-399"}, "built for cpython-399"),
        ({"modules": {}}, "another list of modules"),
        ({"shared": "gone.so"}, "files missing"),
        ({"modules": {name: {"file": f"{name}.so"} for name in MODULES}}, "sources not readable"),
    ],
)
def test_a_build_for_another_python_or_list_with_files_missing_or_a_bad_manifest_is_not_loaded_and_says_why_once(
    tmp_path, caplog, change, problem
):
    """Someone built it and this process cannot use it: running from source is right, and so is saying so."""
    build = Build.read(write_build(tmp_path, **change))
    assert build.files == {} and problem in str(build.problem)
    finder = CompiledFinder(tmp_path)
    with caplog.at_level(logging.WARNING, logger="agentcache"):
        assert [finder.find_spec(name) for name in MODULES] == [None] * len(MODULES)
    warnings = [r.getMessage() for r in caplog.records if "compiled policy core" in r.getMessage()]
    assert len(warnings) == 1 and problem in warnings[0] and "running it from source" in warnings[0], warnings


def test_no_build_runs_from_source_quietly_and_an_unreadable_manifest_says_why(tmp_path, caplog):
    """No build is what a machine without a C compiler has (setup warned already): nothing to say at each import."""
    assert Build.read(tmp_path).kind is Problem.NOT_BUILT
    with caplog.at_level(logging.WARNING, logger="agentcache"):
        assert CompiledFinder(tmp_path).find_spec("agentcache.policy.pbkv.policy") is None
    assert not [r for r in caplog.records if "compiled policy core" in r.getMessage()]
    (tmp_path / MANIFEST).write_text("{not json")
    unreadable = Build.read(tmp_path)
    assert unreadable.kind is Problem.UNREADABLE and "unreadable manifest" in str(unreadable.problem)
    with caplog.at_level(logging.WARNING, logger="agentcache"):
        assert CompiledFinder(tmp_path).find_spec("agentcache.policy.pbkv.policy") is None
    assert [r for r in caplog.records if "unreadable manifest" in r.getMessage()]
    shutil.rmtree(tmp_path)
    assert CompiledFinder(tmp_path).find_spec("agentcache.policy.pbkv.policy") is None
