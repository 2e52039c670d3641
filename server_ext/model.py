"""Small random-weight Llama models with a locally trained tokenizer, for running SGLang without downloads.

Random weights generate nonsense, but the compute is real: prefill and decode
cost what a model of this shape costs, so cache hits show up in latency. The
tokenizer is a byte-level BPE trained here on a built-in corpus, so any text
round-trips. Sizes:

- tiny:   hidden 64, 2 layers. Starts fast; for tests.
- small:  hidden 256, 6 layers. On two CPU cores prefill dominates request
          latency (about a second per thousand prompt tokens), so cache hits
          are visible: the default for the demo.
- medium: hidden 512, 8 layers. For patience on a CPU.
- large:  hidden 2048, 16 layers (about 0.9 B parameters). For a GPU, where
          smaller models prefill too fast for cache hits to matter.
"""

from __future__ import annotations

import json
from pathlib import Path

SIZES: dict[str, dict[str, int]] = {
    "tiny": {
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
    },
    "small": {
        "hidden_size": 256,
        "intermediate_size": 768,
        "num_hidden_layers": 6,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 32,
    },
    "medium": {
        "hidden_size": 512,
        "intermediate_size": 1536,
        "num_hidden_layers": 8,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 64,
    },
    "large": {
        "hidden_size": 2048,
        "intermediate_size": 5632,
        "num_hidden_layers": 16,
        "num_attention_heads": 16,
        "num_key_value_heads": 4,
        "head_dim": 128,
    },
}
VOCAB_SIZE = 2048
MAX_POSITIONS = 32768
MARKER = "agentcache-model.json"  # written last: a directory without it is incomplete

_CORPUS = [
    "You are a helpful assistant in a team of agents. The planner breaks the task into steps; the coder writes "
    "Python; the tester runs the tests and reports failures; the analyzer reads the failures and tells the coder "
    "what to change; the reviewer checks the final answer. Be concise and precise.",
    "def solve(numbers: list[int]) -> int:\n    total = 0\n    for n in numbers:\n        if n % 2 == 0:\n"
    "            total += n\n    return total\n\nassert solve([1, 2, 3, 4]) == 6\n",
    "Claim: the Eiffel Tower was completed in 1889. Evidence: the tower was built for the 1889 World's Fair in "
    "Paris and opened on 31 March 1889. Verdict: SUPPORTED.",
    '{"name": "search", "description": "Search the web", "parameters": {"type": "object", "properties": '
    '{"query": {"type": "string"}}, "required": ["query"]}}',
    "The quick brown fox jumps over the lazy dog. 0123456789 ,.;:!?()[]{}<>=+-*/%&|^~ \"'`@#$_\\ \t\n",
    'Traceback (most recent call last):\n  File "test_app.py", line 12, in test_sum\n    assert total == 10\n'
    "AssertionError: expected 10, got 9\nFAILED tests/test_app.py::test_sum - AssertionError",
]


def is_model_dir(path: str | Path) -> bool:
    return (Path(path) / MARKER).is_file()


def make_model(out_dir: str | Path, size: str = "small", seed: int = 0) -> Path:
    """Write a random-weight Llama of `size` and its tokenizer to `out_dir` (created); returns the path."""
    if size not in SIZES:
        raise ValueError(f"unknown model size {size!r}; choose from {', '.join(SIZES)}")
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / MARKER).unlink(missing_ok=True)

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|pad|>"]
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS * 50, trainer)
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>", bos)]
    )
    hf_tok = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<|begin_of_text|>", eos_token="<|end_of_text|>", pad_token="<|pad|>"
    )
    # A template whose rendering of the first n messages is a prefix of the rendering of all of them.
    hf_tok.chat_template = (
        "{% if tools %}<|tools|>{{ tools | tojson }}\n{% endif %}"
        "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}"
    )
    hf_tok.save_pretrained(out)

    shape = SIZES[size]
    config = LlamaConfig(
        vocab_size=len(hf_tok),
        max_position_embeddings=MAX_POSITIONS,
        bos_token_id=hf_tok.bos_token_id,
        eos_token_id=hf_tok.eos_token_id,
        pad_token_id=hf_tok.pad_token_id,
        tie_word_embeddings=False,
        torch_dtype="bfloat16",
        **shape,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    params = sum(p.numel() for p in model.parameters())
    (out / MARKER).write_text(json.dumps({"size": size, "params": params, "vocab": len(hf_tok), "seed": seed}))
    return out
