"""Stamps per prompt, after SGLang's own normalisation of a batch or an `n` group, without a server: SGLang's
GenerateReqInput through the intake hooks, as its TokenizerManager runs them."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

from agentcache.tags import KEY, Stamped


def run_generate(obj, tokenizer=None) -> list[Stamped]:
    """`obj` through around_generate and SGLang's normalisation; each prompt's stamp as SGLang tokenized it."""
    from agentcache.server_ext.intake import around_generate, before_tokenized_object

    manager = SimpleNamespace(model_config=SimpleNamespace(vocab_size=0), tokenizer=tokenizer)
    stamps: list[Stamped] = []

    async def original(tm, req, *args, **kwargs):
        req.normalize_batch_and_arguments()
        for i in range(1 if req.is_single else req.batch_size):
            one = req if req.is_single else req[i]
            ids = one.input_ids if one.input_ids is not None else tokenizer.encode(one.text)
            before_tokenized_object(tm, one, one.text, ids)
            stamps.append(Stamped.from_wire(one.sampling_params["custom_params"][KEY]))
        yield "done"

    async def drain():
        return [out async for out in around_generate(original, manager, obj, None)]

    assert asyncio.run(drain()) == ["done"]
    return stamps


def tags_for(**fields) -> dict:
    return {"custom_params": {KEY: {"v": 1, "workflow": "w", "agent": "a", **fields}}, "max_new_tokens": 1}


def test_each_prompt_of_a_batch_gets_its_own_stamp_and_boundary():
    from sglang.srt.managers.io_struct import GenerateReqInput

    stamps = run_generate(GenerateReqInput(input_ids=[[5] * 10, [6] * 3], sampling_params=tags_for(fixed_tokens=8)))
    assert stamps[0].tags is not None and stamps[0].tags.fixed_tokens == 8
    assert stamps[1] == Stamped("", None, "bad_fixed_tokens"), "a boundary past this prompt: served untagged"
    untagged = run_generate(GenerateReqInput(input_ids=[[5] * 4, [6] * 4], sampling_params={"max_new_tokens": 1}))
    assert all(s.tags is not None and s.tags.implicit for s in untagged)
    assert untagged[0].tags.workflow != untagged[1].tags.workflow, "each prompt its own implicit workflow"
    assert untagged[0].tags.agent != untagged[1].tags.agent, "each prompt's agent by its own head"


def test_an_n_group_is_one_call_of_n_plus_one_requests():
    from sglang.srt.managers.io_struct import GenerateReqInput

    (stamp,) = run_generate(GenerateReqInput(input_ids=[5] * 6, sampling_params={**tags_for(), "n": 4}))
    assert stamp.call and stamp.members == 5, "SGLang sends a warm-up and 4 samples"
    assert Stamped.from_wire(stamp.to_wire()) == stamp
    a, b = run_generate(GenerateReqInput(input_ids=[[5] * 6, [7] * 6], sampling_params={**tags_for(), "n": 2}))
    assert a.call != b.call and a.members == b.members == 3
    (single,) = run_generate(GenerateReqInput(input_ids=[5] * 6, sampling_params=tags_for()))
    assert single.call is None and single.members == 1


def test_a_calls_requests_are_observed_once_and_it_ends_with_its_last():
    from agentcache.server_ext.calls import Calls

    calls, group = Calls(), Stamped("", None, None, "c1", 3)
    assert [calls.join(rid, group) for rid in ("w", "s1", "s2")] == [True, False, False]
    assert calls.join("alone", Stamped("")) and calls.leave("alone")
    assert not calls.leave("w")
    assert not calls.leave("s1") and calls.leave("s2") and len(calls) == 0


class SlowTokenizer:
    """A character a token; encoding takes `delay_s` (releasing the GIL, as the real tokenizer does)."""

    def __init__(self, delay_s: float):
        self.delay_s = delay_s

    def encode(self, text: str) -> list[int]:
        time.sleep(self.delay_s)
        return [ord(c) for c in text]


def test_fixed_chars_are_tokenized_off_the_event_loop_and_resolved_against_sglangs_ids():
    from sglang.srt.managers.io_struct import GenerateReqInput

    from agentcache.server_ext.intake import around_generate, before_tokenized_object

    text = "fixed prompt | the rest"
    obj = GenerateReqInput(text=text, sampling_params=tags_for(fixed_chars=12))
    manager = SimpleNamespace(model_config=SimpleNamespace(vocab_size=0), tokenizer=SlowTokenizer(0.5))
    stamps = []

    async def original(tm, req, *args, **kwargs):
        req.normalize_batch_and_arguments()
        before_tokenized_object(tm, req, req.text, [ord(c) for c in req.text])  # SGLang's ids, not re-tokenized
        stamps.append(Stamped.from_wire(req.sampling_params["custom_params"][KEY]))
        yield "done"

    async def scenario():
        ticks = 0

        async def tick():
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        ticker = asyncio.create_task(tick())
        outs = [out async for out in around_generate(original, manager, obj, None)]
        ticker.cancel()
        return outs, ticks

    outs, ticks = asyncio.run(scenario())
    assert outs == ["done"] and ticks >= 20, "the event loop kept running while the fixed text was tokenized"
    assert stamps[0].tags is not None and stamps[0].tags.fixed_tokens == 12


def test_fixed_chars_are_resolved_per_prompt_of_a_text_batch():
    from sglang.srt.managers.io_struct import GenerateReqInput

    chars = SimpleNamespace(encode=lambda text: [ord(c) for c in text])
    first, second = run_generate(
        GenerateReqInput(text=["system: be brief | task one", "hi"], sampling_params=tags_for(fixed_chars=8)),
        tokenizer=chars,
    )
    assert first.tags.fixed_tokens == 8 and second.tags.fixed_tokens == 2, "a text shorter than the boundary: all of it"
    assert first.tags.ts and first.tags.workflow == second.tags.workflow == "w", "one tag object, each prompt a call"
