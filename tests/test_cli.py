"""The `agentcache` command's front: it loads a command's module only once it knows the command, and where an
extra is missing it says which to install, in one line, never with a traceback."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from agentcache.cli import COMMANDS, build_parser


def run_without(modules: list[str], argv: list[str], cwd=None) -> subprocess.CompletedProcess:  # noqa: ANN001
    """`agentcache ARGV` in a fresh interpreter where importing any of `modules` fails, as when not installed."""
    code = textwrap.dedent(
        f"""
        import sys
        for name in {modules!r}:
            sys.modules[name] = None  # import fails: ModuleNotFoundError, as for a package not installed
        from agentcache.cli import main
        sys.exit(main({argv!r}))
        """
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=cwd)


def test_the_list_of_commands_needs_only_the_standard_library():
    code = textwrap.dedent(
        """
        import sys
        before = set(sys.modules)
        from agentcache.cli import main
        try:
            main(["--help"])
        except SystemExit as exc:
            assert exc.code == 0, exc.code
        loaded = {name.partition(".")[0] for name in set(sys.modules) - before}
        print(sorted(loaded - set(sys.stdlib_module_names) - {"agentcache"}))
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"
    assert "eval-predictor" in done.stdout


@pytest.mark.parametrize("command", list(COMMANDS))
def test_each_command_is_listed_with_the_help_its_own_parser_has(command):
    """The list of commands is written without loading them: it says what each command's module says."""
    assert build_parser(command).format_help() == build_parser().format_help()


@pytest.mark.parametrize(
    ("missing", "argv", "extra"),
    [
        (["rich"], ["gen", "chat", "-o", "trace.jsonl"], "cli"),
        (["rich"], ["bench", "--help"], "cli"),
        (["rich"], ["train", "--help"], "cli"),
        (["openai"], ["demo", "--workflows", "1", "--repeat", "1", "--log-dir", "."], "cli"),
        (["sglang"], ["replay", "TRACE", "--capacity", "2000", "--policy", "lru"], "server"),
        (["torch", "transformers", "tokenizers"], ["make-model", "MODEL"], "server"),
    ],
)
def test_a_missing_extra_is_named_with_how_to_install_it(tmp_path, missing, argv, extra):
    from agentcache.trace import write_trace
    from agentcache.workloads import GenConfig, generate

    write_trace(tmp_path / "trace.jsonl", generate("chat", GenConfig(workflows=2, seed=1)))
    argv = [{"TRACE": str(tmp_path / "trace.jsonl"), "MODEL": str(tmp_path / "model")}.get(a, a) for a in argv]
    done = run_without(missing, argv, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert f"agentcache {argv[0]} needs the '{extra}' extra" in done.stderr
    assert f"pip install 'agentcache[{extra}]'" in done.stderr
    assert done.stdout == ""


def test_a_module_no_extra_provides_still_fails_loudly():
    """Only the extras' own packages are reported as an extra to install: a missing module of agentcache's own is a
    bug, shown whole."""
    done = run_without(["agentcache.workloads"], ["gen", "chat", "-o", "trace.jsonl"])
    assert done.returncode == 1
    assert "Traceback" in done.stderr and "needs the" not in done.stderr
