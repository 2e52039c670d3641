"""What every page writer shares: where the pages go, the commit and command each page and its figures record,
the progress bar, and the page prose kept in templates (benchmarks/templates/). Importing it first sets what
every writer runs SGLang with: its CPU engine, without the warnings of kernels no writer uses.

A result page is `docs/results/NAME.md`; its figures, where it has any, `docs/results/NAME.json`: an object
with the writer's figures beside `commit` (`git rev-parse --short HEAD`, `-dirty` when tracked files had
changes) and `command` (the command line that ran the writer), and `stale` where the page was made before the
policy last changed. The page opens with its title, then `Made by `COMMAND` at commit `COMMIT`.` and, on a
stale page, `Stale: <why>`. A writer renders the rest (`save(name, render, figures)`: `render` gets what the
JSON holds); where it renders from the JSON alone, `render_again` writes the page again without running
anything, and tests/test_benchmark_pages.py checks that each such committed page is its figures.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from string import Template
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID

os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")

from agentcache.engine.sglang_warnings import ignore_sglang_gpu_only_warnings  # noqa: E402

ignore_sglang_gpu_only_warnings()  # as the CLI does: the pages' progress bars come first

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = ROOT / "docs" / "results"
TEMPLATES = HERE / "templates"
MADE_BY = "Made by `"
# The stamp line under a page's title. A page two writers share (reliability.md) names both on it; the groups
# match the first.
MADE_BY_LINE = re.compile(
    r"\nMade by `(?P<command>[^`\n]+)` at commit `(?P<commit>(?:[0-9a-f]{7,40}(?:-dirty)?|unknown))`[^\n]*\n"
)
STALE = "Stale: "


def commit() -> str:
    """The checkout's commit, `-dirty` when tracked files differ from it (untracked files do not count);
    `unknown` in a copy of the tree without git (the GPU machine's)."""
    try:
        head = _git("rev-parse", "--short", "HEAD")
        dirty = _git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("-dirty" if dirty else "")


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()


def command() -> str:
    """The command line that ran this script, as typed from the repository root."""
    script = Path(sys.argv[0]).resolve()
    shown = script.relative_to(ROOT) if script.is_relative_to(ROOT) else script
    return shlex.join(["python", str(shown), *sys.argv[1:]])


def provenance() -> dict[str, str]:
    return {"commit": commit(), "command": command()}


def stamped(body: str, saved: dict) -> str:
    """The page: `body` (title, blank line, the rest) with, under the title, the commit and command that made it
    and, where `saved` (what its JSON holds) says the page is stale, why."""
    title, _, rest = body.partition("\n")
    stale = f"\n{STALE}{saved['stale']}" if saved.get("stale") else ""
    return f"{title}\n\n{MADE_BY}{saved['command']}` at commit `{saved['commit']}`.{stale}\n{rest}"


def unstamped(page: str) -> tuple[str, dict[str, str] | None]:
    """`stamped` undone: the page as its writer rendered it, and the commit, command (and `stale`) its stamp
    names (None for a page without one)."""
    title, _, rest = page.partition("\n")
    made = MADE_BY_LINE.match(rest)
    if made is None:
        return page, None
    rest = rest[made.end() :]
    saved = {"command": made["command"], "commit": made["commit"]}
    if rest.startswith(STALE):
        stale, _, rest = rest.partition("\n")
        saved["stale"] = stale.removeprefix(STALE)
    return f"{title}\n{rest}", saved


def save(name: str, render: Callable[[dict], str], figures: dict | None = None, *, folder: Path = RESULTS) -> None:
    """Write `folder/NAME.md` and, with `figures`, `folder/NAME.json` (the figures, this run's commit and command):
    the page is `render(saved)`, `saved` being what the JSON holds, under the commit and command's line."""
    saved = {**provenance(), **(figures or {})}
    folder.mkdir(parents=True, exist_ok=True)
    written = [folder / f"{name}.md"]
    written[0].write_text(stamped(render(saved), saved))
    if figures is not None:
        written.append(folder / f"{name}.json")
        written[1].write_text(json.dumps(saved, indent=1) + "\n")
    print("wrote " + ", ".join(str(_shown(path)) for path in written), file=sys.stderr)


def render_again(name: str, render: Callable[[dict], str], *, folder: Path = RESULTS) -> None:
    """Write `NAME.md` again from `NAME.json`, running nothing."""
    saved = load(name, folder=folder)
    (folder / f"{name}.md").write_text(stamped(render(saved), saved))
    print(f"wrote {_shown(folder / f'{name}.md')} from its figures", file=sys.stderr)


def load(name: str, *, folder: Path = RESULTS) -> dict:
    """What `NAME.json` holds: the figures, `commit` and `command`."""
    return json.loads((folder / f"{name}.json").read_text())


def _shown(path: Path) -> Path:
    return path.relative_to(ROOT) if path.is_relative_to(ROOT) else path


class Bar:
    """One task of a progress bar."""

    def __init__(self, bar: Progress, task: TaskID):
        self._bar, self._task = bar, task

    def advance(self, steps: float = 1) -> None:
        self._bar.advance(self._task, steps)

    def describe(self, description: str) -> None:
        self._bar.update(self._task, description=description)

    def print(self, text: str) -> None:
        """A line above the bar."""
        self._bar.console.print(text)


@contextmanager
def progress(description: str, total: float) -> Iterator[Bar]:
    """A progress bar on stderr: what runs now, the bar, steps done of all, time so far."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=Console(stderr=True)) as bar:
        yield Bar(bar, bar.add_task(description, total=total))


def template(name: str, **values: object) -> list[str]:
    """`benchmarks/templates/NAME` with its `$placeholders` filled in, as lines (no trailing blank line)."""
    return Template((TEMPLATES / name).read_text()).substitute(values).rstrip("\n").split("\n")


def save_section(name: str, marker: str, lines: list[str], figures: dict | None = None) -> None:
    """Write this writer's section of `docs/results/NAME.md`, a page several writers share, between its markers,
    under a line naming the commit and command that made it; with `figures`, write `NAME.json` (with them)."""
    made = provenance()
    stamp = f"{MADE_BY}{made['command']}` at commit `{made['commit']}`."
    write_between_markers(RESULTS / f"{name}.md", marker, "\n".join([stamp, "", *lines]))
    written = [f"docs/results/{name}.md's {marker} section"]
    if figures is not None:
        (RESULTS / f"{name}.json").write_text(json.dumps({**made, **figures}, indent=1) + "\n")
        written.append(f"docs/results/{name}.json")
    print("wrote " + ", ".join(written), file=sys.stderr)


def write_between_markers(path: Path, name: str, text: str) -> None:
    """Replace what lies between `<!-- name:begin -->` and `<!-- name:end -->` in `path` (a benchmark's part of
    a page others write too); the markers are added at the end of the page when missing."""
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    block = f"{begin}\n{text.rstrip()}\n{end}"
    page = path.read_text() if path.exists() else ""
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.S)
    if pattern.search(page):
        page = pattern.sub(lambda _: block, page)
    else:
        page = page.rstrip() + ("\n\n" if page else "") + block + "\n"
    path.write_text(page)
