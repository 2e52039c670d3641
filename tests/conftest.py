"""Shared test set-up: SGLang runs in CPU mode, and small traces are generated once."""

from __future__ import annotations

import os

import pytest

# Must be set before SGLang is imported anywhere in the test process.
os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")


@pytest.fixture(scope="session")
def small_traces():
    """One small trace per generated family (a few dozen workflows each)."""
    from agentcache.workloads import FAMILIES, GenConfig, generate

    return {family: generate(family, GenConfig(workflows=30, rate=1.0, seed=3)) for family in FAMILIES}
