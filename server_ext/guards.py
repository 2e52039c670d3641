"""Prompts the engine would crash on, refused in the HTTP process with a 400 that says why.

SGLang 0.5.23 lets these through to the scheduler, whose forward pass then raises, and a scheduler that
raises takes every process of the server down with it: an empty prompt in a batch, out-of-vocabulary ids,
more top log-probabilities than the vocabulary has. Refused here with a ValueError, which SGLang answers
with HTTP 400 and the message.
"""

from __future__ import annotations

from typing import Any


def check_token_ids(input_ids: Any, vocab_size: int, where: str = "input_ids") -> None:
    """Refuse ids the model cannot embed (out of the vocabulary, or not integers)."""
    if not isinstance(input_ids, list) or not input_ids or not vocab_size:
        return
    if not all(isinstance(t, int) and not isinstance(t, bool) for t in input_ids):
        raise ValueError(f"{where} must be a list of integers")
    low, high = min(input_ids), max(input_ids)
    if low < 0 or high >= vocab_size:
        bad = low if low < 0 else high
        raise ValueError(f"{where} contains out-of-vocabulary token id {bad}; valid range is [0, {vocab_size})")


def check_request(obj: Any, vocab_size: int) -> None:
    """Refuse a generate request whose prompts or log-probability asks would crash the scheduler."""
    ids = obj.input_ids
    if isinstance(ids, list) and ids and isinstance(ids[0], list):  # a batch of prompts
        for i, prompt in enumerate(ids):
            if not prompt:
                # A prefill batch of nothing but empty prompts is a tensor of 0 elements the model cannot reshape.
                raise ValueError(f"input_ids[{i}] is empty: every prompt of a batch needs at least one token")
            check_token_ids(prompt, vocab_size, f"input_ids[{i}]")
    else:
        check_token_ids(ids, vocab_size)
    counts = obj.top_logprobs_num if isinstance(obj.top_logprobs_num, list) else [obj.top_logprobs_num]
    for n in counts:
        if isinstance(n, int) and vocab_size and n > vocab_size:
            raise ValueError(f"top_logprobs_num {n} exceeds the vocabulary's {vocab_size} tokens")


def before_validate(tokenizer_manager: Any, obj: Any, input_ids: Any, *args: Any, **kwargs: Any) -> None:
    """BEFORE hook on TokenizerManager._validate_one_request: each prompt, as the engine will see it.

    Text can tokenize to nothing (an empty string, with a tokenizer that adds no BOS token).
    """
    session = getattr(obj, "session_params", None)
    if isinstance(input_ids, list) and not input_ids and not (isinstance(session, dict) and session.get("id")):
        raise ValueError("the prompt is empty: it has no tokens once tokenized")
    return None
