"""Generate the tiny test model directories (config + byte-level BPE tokenizer, no weights).

Run from the repo root: `python python/sglang/test/assets/make_tiny_assets.py`. The outputs are committed:
  tiny-llama/  LlamaForCausalLM, 4 layers, untied embeddings
  tiny-qwen3/  Qwen3ForCausalLM, 3 layers, head_dim 32 (!= hidden/heads), tied embeddings, q/k norms
Both share one tokenizer trained here on the embedded text below. Weights are made on demand by
`sglang.test.tiny_models.write_random_checkpoint`.
"""

from __future__ import annotations

import json
import os
from typing import Any

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

HERE = os.path.dirname(os.path.abspath(__file__))
VOCAB_SIZE = 768
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # ids 0, 1, 2
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

CORPUS = """
The capital of France is Paris. The capital of Germany is Berlin, and the capital of Italy is Rome.
Paris is known for the Eiffel Tower, wide streets, small cafes and a long history of art and science.
A river runs through the middle of the city, and many bridges cross it from one bank to the other.
Once upon a time there was a little robot who wanted to learn how to paint the sky at night.
Every morning the robot walked to the hill, looked at the clouds, and wrote down their colors.
The quick brown fox jumps over the lazy dog. The lazy dog did not seem to mind at all.
Numbers are everywhere: 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 42, 100, 2024, 3.14159 and 1e-5.
Question: What is two plus two? Answer: Two plus two is four. Question: What is ten minus three?
Answer: Ten minus three is seven. Counting slowly helps: one, two, three, four, five, six, seven.
A good engineer writes small functions, names them well, and tests what could actually fail.
def add(a, b):
    return a + b

for i in range(10):
    print(i * i)

if __name__ == "__main__":
    main()
The scheduler takes requests from a queue, groups them into a batch, and runs the model once per step.
Each request keeps its tokens, its position, and a pointer into the key value cache.
When the cache is full, the oldest unused prefix is evicted and its memory is given back to the pool.
Weather report: sunny in the morning, cloudy in the afternoon, light rain in the evening.
Temperatures between 12 and 18 degrees. Wind from the west at 20 kilometers per hour.
Dear friend, thank you for your letter. I hope you are well and that your garden is growing.
We planted tomatoes, beans, carrots, and a few sunflowers that are already taller than the fence.
User: Can you help me write a poem about the sea? Assistant: Of course! Here is a short poem.
The sea is wide, the sea is deep, it sings the sailors off to sleep.
User: Thank you, that is lovely. Assistant: You are welcome. Let me know if you want another one.
Some words from other languages: cafe, naive, resume, uber, jalapeno, smorgasbord, fjord.
Cafe au lait, creme brulee and a croissant make a fine breakfast in a small Parisian cafe.
The history of computing starts with counting machines, then mechanical calculators, then
electronic computers that filled whole rooms, and finally small chips inside every phone.
Learning is a process: read, try, fail, understand, and try again until it works.
The library opens at nine and closes at five. Books must be returned within two weeks.
Mathematics: the square of three is nine, the square of four is sixteen, the square root of
sixty four is eight. Prime numbers: two, three, five, seven, eleven, thirteen, seventeen.
In the beginning the universe was small, hot and dense; then it expanded and cooled down.
Stars formed from clouds of gas, and planets formed from the dust that was left around them.
"Hello," she said. "Hello," he answered. They both laughed, because neither knew what to say next.
It was a bright cold day in April, and the clocks were striking the hour across the town.
""".strip()


def train_tokenizer() -> Tokenizer:
    """Byte-level BPE (GPT-2 style) with the ChatML special tokens at ids 0..2."""
    tk = Tokenizer(models.BPE(fuse_unk=False, byte_fallback=False))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
    tk.decoder = decoders.ByteLevel()
    tk.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tk.train_from_iterator(CORPUS.splitlines(keepends=True), trainer=trainer)
    return tk


def tokenizer_config(bos_token: str | None) -> dict[str, Any]:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": bos_token,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 4096,
        "chat_template": CHATML_TEMPLATE,
    }


def llama_config(vocab_size: int) -> dict[str, Any]:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-05,
        "rope_theta": 10000.0,
        "rope_scaling": None,
        "max_position_embeddings": 4096,
        "vocab_size": vocab_size,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "mlp_bias": False,
        "initializer_range": 0.02,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 0,
        "use_cache": True,
        "torch_dtype": "float32",
    }


def qwen3_config(vocab_size: int) -> dict[str, Any]:
    return {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-06,
        "rope_theta": 1000000.0,
        "rope_scaling": None,
        "max_position_embeddings": 4096,
        "vocab_size": vocab_size,
        "tie_word_embeddings": True,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "use_sliding_window": False,
        "sliding_window": None,
        "max_window_layers": 3,
        "initializer_range": 0.02,
        "bos_token_id": None,
        "eos_token_id": 2,
        "pad_token_id": 0,
        "use_cache": True,
        "torch_dtype": "float32",
    }


def _write_json(path: str, data: dict[str, Any]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2, ensure_ascii=False)
        f.write("\n")


def main() -> None:
    tk = train_tokenizer()
    vocab_size = tk.get_vocab_size(with_added_tokens=True)
    assert [tk.token_to_id(t) for t in SPECIAL_TOKENS] == [0, 1, 2]
    for name, config, bos in (
        ("tiny-llama", llama_config(vocab_size), "<|im_start|>"),
        ("tiny-qwen3", qwen3_config(vocab_size), None),
    ):
        out = os.path.join(HERE, name)
        os.makedirs(out, exist_ok=True)
        _write_json(os.path.join(out, "config.json"), config)
        _write_json(os.path.join(out, "tokenizer_config.json"), tokenizer_config(bos))
        tk.save(os.path.join(out, "tokenizer.json"), pretty=False)
        print(f"wrote {out} (vocab {vocab_size})")


if __name__ == "__main__":
    main()
