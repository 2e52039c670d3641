"""Fault injection for tests/test_policy_fault_e2e.py: on PYTHONPATH, every process of the server it starts makes
pbkv's key computation raise once, at its AGENTCACHE_TEST_FAULT_AFTER-th call (a bug the policy could have)."""

import builtins
import os
import sys

_after = int(os.environ.get("AGENTCACHE_TEST_FAULT_AFTER") or 0)
_import = builtins.__import__


def _import_and_inject(name, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
    module = _import(name, *args, **kwargs)
    pbkv = sys.modules.get("agentcache.policy.pbkv")
    if pbkv is not None and hasattr(pbkv, "PBKVPolicy"):  # imported in full: inject once, then step aside
        builtins.__import__ = _import
        ranking = sys.modules["agentcache.policy.pbkv.score"].Ranking
        compute, calls = ranking.key, []

        def key(self, node, t):  # noqa: ANN001, ANN202
            calls.append(None)
            if len(calls) == _after:
                raise KeyError("a fault injected into pbkv's key computation")
            return compute(self, node, t)

        ranking.key = key
    return module


if _after:
    builtins.__import__ = _import_and_inject
