"""What `agentcache serve` sets so that its processes give large freed blocks back to the system."""

from __future__ import annotations

import pytest

from agentcache.server_ext.launcher import ServeOptions, sglang_command


def test_the_server_gives_freed_blocks_of_a_megabyte_back_and_the_operators_setting_wins(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    for plugin in (True, False):  # the plain SGLang baselines alike, so that comparisons stay fair
        _, env = sglang_command(ServeOptions(cpu=True, plugin=plugin), "/models/m")
        assert env["MALLOC_MMAP_THRESHOLD_"] == str(1 << 20)
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "65536")
    _, env = sglang_command(ServeOptions(cpu=True), "/models/m")
    assert env["MALLOC_MMAP_THRESHOLD_"] == "65536"
