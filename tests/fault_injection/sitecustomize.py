"""Fault injection for tests/test_policy_fault_e2e.py: on PYTHONPATH, every process of the server it starts makes
pbkv's key computation raise once, at its AGENTCACHE_TEST_FAULT_AFTER-th call, and the walk of a request's path in
the checkpoint into the tree raise once, at its AGENTCACHE_TEST_SPLIT_FAULT_AFTER-th call (bugs the policy and the
engine layer could have)."""

import builtins
import os
import sys

_after = int(os.environ.get("AGENTCACHE_TEST_FAULT_AFTER") or 0)
_split_after = int(os.environ.get("AGENTCACHE_TEST_SPLIT_FAULT_AFTER") or 0)
_import = builtins.__import__
_pending = {"key": bool(_after), "split": bool(_split_after)}


def _raising(compute, after, message):  # noqa: ANN001, ANN202
    calls = []

    def call(*args):  # noqa: ANN002, ANN202
        calls.append(None)
        if len(calls) == after:
            raise KeyError(message)
        return compute(*args)

    return call


def _import_and_inject(name, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
    module = _import(name, *args, **kwargs)
    pbkv = sys.modules.get("agentcache.policy.pbkv")
    if _pending["key"] and pbkv is not None and hasattr(pbkv, "PBKVPolicy"):  # imported in full
        _pending["key"] = False
        ranking = sys.modules["agentcache.policy.pbkv.score"].Ranking
        ranking.key = _raising(ranking.key, _after, "a fault injected into pbkv's key computation")
    fixed_prompt = sys.modules.get("agentcache.engine.fixed_prompt")
    if _pending["split"] and fixed_prompt is not None and hasattr(fixed_prompt, "split_and_tag"):
        _pending["split"] = False
        fixed_prompt.path_nodes = _raising(fixed_prompt.path_nodes, _split_after, "a fault injected into a path's walk")
    if not any(_pending.values()):  # injected: step aside
        builtins.__import__ = _import
    return module


if any(_pending.values()):
    builtins.__import__ = _import_and_inject
