"""Compile the policy core (agentcache.compiled.MODULES) with mypyc: ``python -m agentcache.build_compiled``.

Run by scripts/setup.sh, and again after editing one of those modules (until then they run from source).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from agentcache.compiled import BUILD_DIR, GROUP, MANIFEST, MODULES, SHARED_MODULE, Build, digest, package_dirs


def build(directory: Path = BUILD_DIR) -> Build:
    """Compile :data:`MODULES` into `directory` (replaced whole once the build succeeded) and write the
    manifest. The package's sources are staged under their import names first: mypyc names a module after its
    path, and the predictor's sources live in predictor/, not agentcache/predictor/."""
    from mypyc.build import mypycify
    from setuptools import Distribution

    with tempfile.TemporaryDirectory(prefix="agentcache-compile-") as tmp:
        staged = Path(tmp) / "src"
        # The whole package, so that mypy types every import of a compiled module; only MODULES are compiled.
        packages = {"agentcache", "agentcache.predictor", "agentcache.engine", "agentcache.policy"}
        for package in sorted(packages | {name.rpartition(".")[0] for name in MODULES}):
            target = staged.joinpath(*package.split("."))
            target.mkdir(parents=True, exist_ok=True)
            for py in package_dirs(package)[0].glob("*.py"):
                if py.name in ("neural.py", "training.py"):  # torch: slow to type, and off the hot path
                    continue
                shutil.copyfile(py, target / py.name)
        paths = {name: str(Path(*name.split(".")).with_suffix(".py")) for name in MODULES}
        # The digests of what is compiled, read from the staged copies: an edit during the build makes it stale.
        digests = {name: digest(staged / path) for name, path in paths.items()}
        cwd = os.getcwd()
        os.chdir(staged)
        try:
            # Only the compiled modules must type-check; what they import is read for its types alone.
            flags = ["--ignore-missing-imports", "--follow-imports=silent", "--no-site-packages"]
            extensions = mypycify([*paths.values(), *flags], opt_level="3", group_name=GROUP)
            distribution = Distribution({"ext_modules": extensions, "script_name": "setup.py"})
            command = distribution.get_command_obj("build_ext")
            command.build_lib = str(Path(tmp) / "lib")
            command.build_temp = str(Path(tmp) / "temp")
            command.parallel = os.cpu_count() or 1
            distribution.run_command("build_ext")
        finally:
            os.chdir(cwd)
        built = Path(tmp) / "lib"
        manifest = {
            "cache_tag": sys.implementation.cache_tag,
            "shared": next(p.name for p in built.glob(f"{SHARED_MODULE}.*")),
            "modules": {
                name: {
                    "file": str(
                        next(built.joinpath(*name.split(".")[:-1]).glob(f"{name.rpartition('.')[2]}.*")).relative_to(
                            built
                        )
                    ),
                    "source_sha256": digests[name],
                }
                for name in MODULES
            },
        }
        (built / MANIFEST).write_text(json.dumps(manifest, indent=1))
        if directory.exists():
            shutil.rmtree(directory)
        shutil.copytree(built, directory)
    return Build.read(directory)


def main() -> None:
    from rich.console import Console

    console = Console(stderr=True)
    with console.status(f"compiling the policy core with mypyc ({len(MODULES)} modules, a minute or two)"):
        result = build()
    if result.problem:
        raise SystemExit(f"agentcache.compiled: the build is not loadable: {result.problem}")
    console.print(f"compiled {len(MODULES)} modules into {result.directory}")


if __name__ == "__main__":
    main()
