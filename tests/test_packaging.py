"""pyproject.toml lists its packages by hand (the top-level folders map onto one import namespace): every package
in the tree must be listed, or a non-editable install (`pip install .`) goes without it."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NOT_PACKAGES = {"shims", "_compiled", "__pycache__"}  # package data (the sgl_kernel stub), build output


def test_every_package_in_the_tree_is_in_pyproject():
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    package_dirs = setuptools["package-dir"]
    listed = set(setuptools["packages"])
    found = set()
    for package, folder in package_dirs.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            relative = init.parent.relative_to(ROOT / folder)
            if not NOT_PACKAGES & set(relative.parts):
                found.add(".".join((package, *relative.parts)))
    assert found - listed == set(), "packages missing from pyproject.toml's [tool.setuptools] packages"
    assert listed - found == set(), "pyproject.toml lists packages that are not in the tree"


def test_the_base_install_is_the_sdk_with_httpx_alone():
    """An app installs the SDK without extras: nothing the command, the benchmarks or the server need comes with
    it (they are the cli and server extras; `agentcache` says which to install when one is missing)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert [re.match(r"[A-Za-z0-9_.-]+", requirement)[0] for requirement in project["dependencies"]] == ["httpx"]
    assert {"cli", "server", "all"} <= set(project["optional-dependencies"])
