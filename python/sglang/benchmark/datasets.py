"""Benchmark datasets: `random`, a ShareGPT-format JSON file, and `generated-shared-prefix`.

Every dataset yields `DatasetRow`s: a text prompt, its length in tokens of the model's tokenizer and
the number of tokens to generate. Random prompts are built from ordinary vocabulary entries and
adjusted until the text tokenizes back to the requested length, so the same text can be sent to
any server (native `/generate` or an OpenAI-compatible one) and still have the intended length.
All randomness comes from one `numpy.random.Generator` seeded by `--seed`.
"""

from __future__ import annotations

import argparse
import json
import re
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

DATASET_NAMES = ("random", "sharegpt", "generated-shared-prefix")
MAX_FIXUP_ROUNDS = 10
SHAREGPT_MAX_PROMPT_LEN = 1024  # ShareGPT filters (without --sharegpt-output-len / context len)
SHAREGPT_MAX_TOTAL_LEN = 2048
_WORD = re.compile(r"^ ?[A-Za-z]{2,}$")


@dataclass
class DatasetRow:
    prompt: str
    prompt_len: int  # tokens of `prompt` (model tokenizer, no special tokens added)
    output_len: int  # tokens to generate
    prompt_ids: Optional[list[int]] = None  # `prompt`'s token ids, when known


def add_dataset_args(parser: argparse.ArgumentParser) -> None:
    """The dataset flags shared by bench_serving and bench_offline_throughput (SGLang's names)."""
    parser.add_argument("--dataset-name", default="random", choices=DATASET_NAMES)
    parser.add_argument(
        "--dataset-path", default="", help="ShareGPT-format JSON file (for --dataset-name sharegpt)"
    )
    parser.add_argument("--num-prompts", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--sharegpt-output-len", type=int, default=None, help="fixed output length for ShareGPT"
    )
    parser.add_argument(
        "--sharegpt-context-len", type=int, default=None, help="drop ShareGPT rows longer than this"
    )
    parser.add_argument("--random-input-len", type=int, default=1024)
    parser.add_argument("--random-output-len", type=int, default=1024)
    parser.add_argument(
        "--random-range-ratio",
        type=float,
        default=0.0,
        help="lengths are drawn uniformly from [len * ratio, len]; 1.0 gives exactly --random-*-len",
    )
    parser.add_argument("--gsp-num-groups", type=int, default=64)
    parser.add_argument("--gsp-prompts-per-group", type=int, default=16)
    parser.add_argument("--gsp-system-prompt-len", type=int, default=2048)
    parser.add_argument("--gsp-question-len", type=int, default=128)
    parser.add_argument("--gsp-output-len", type=int, default=256)


def get_dataset(args: argparse.Namespace, tokenizer: Any) -> list[DatasetRow]:
    """The rows selected by the dataset flags of `args`."""
    rng = np.random.default_rng(args.seed)
    if args.dataset_name == "random":
        return sample_random_requests(
            args.random_input_len,
            args.random_output_len,
            args.num_prompts,
            args.random_range_ratio,
            tokenizer,
            rng,
        )
    if args.dataset_name == "sharegpt":
        if not args.dataset_path:
            raise ValueError(
                "--dataset-name sharegpt needs --dataset-path FILE (a ShareGPT-format JSON file)"
            )
        return sample_sharegpt_requests(
            args.dataset_path,
            args.num_prompts,
            tokenizer,
            rng,
            args.sharegpt_output_len,
            args.sharegpt_context_len,
        )
    if args.dataset_name == "generated-shared-prefix":
        return sample_generated_shared_prefix_requests(
            args.gsp_num_groups,
            args.gsp_prompts_per_group,
            args.gsp_system_prompt_len,
            args.gsp_question_len,
            args.gsp_output_len,
            tokenizer,
            rng,
        )
    raise ValueError(f"unknown dataset {args.dataset_name!r} (choose from {', '.join(DATASET_NAMES)})")


# ---------------------------------------------------------------------------- random text
def word_token_ids(tokenizer: Any) -> list[int]:
    """Ids of ordinary word tokens (letters, optionally a leading space); all regular ids as a fallback."""
    special = set(tokenizer.all_special_ids)
    vocab = len(tokenizer)
    ids = [i for i in range(vocab) if i not in special]
    words = [i for i, text in zip(ids, tokenizer.batch_decode([[i] for i in ids])) if _WORD.match(text)]
    return words if len(words) >= 16 else ids


def encode(tokenizer: Any, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def random_text(
    tokenizer: Any, num_tokens: int, rng: np.random.Generator, vocab: list[int]
) -> tuple[str, list[int]]:
    """Text of random words that tokenizes back to `num_tokens` ids (or as close as a few rounds get)."""
    num_tokens = max(int(num_tokens), 1)
    ids = [int(i) for i in rng.choice(vocab, num_tokens)]
    text, back = "", []
    for _ in range(MAX_FIXUP_ROUNDS):
        text = tokenizer.decode(ids)
        back = encode(tokenizer, text)
        if len(back) == num_tokens:
            break
        if len(back) > num_tokens:
            ids = back[:num_tokens]
        else:
            ids = back + [int(i) for i in rng.choice(vocab, num_tokens - len(back))]
    return text, back


def _lengths(target: int, ratio: float, n: int, rng: np.random.Generator) -> list[int]:
    low = min(max(int(target * ratio), 1), target)
    return [int(x) for x in rng.integers(low, target + 1, size=n)]


def sample_random_requests(
    input_len: int,
    output_len: int,
    num_prompts: int,
    range_ratio: float,
    tokenizer: Any,
    rng: np.random.Generator,
) -> list[DatasetRow]:
    """`num_prompts` random prompts; lengths uniform in [len * range_ratio, len] (SGLang's `random`)."""
    if input_len < 1 or output_len < 1 or num_prompts < 1:
        raise ValueError("--random-input-len, --random-output-len and --num-prompts must be >= 1")
    vocab = word_token_ids(tokenizer)
    in_lens = _lengths(input_len, range_ratio, num_prompts, rng)
    out_lens = _lengths(output_len, range_ratio, num_prompts, rng)
    rows = []
    for n_in, n_out in zip(in_lens, out_lens):
        text, ids = random_text(tokenizer, n_in, rng, vocab)
        rows.append(DatasetRow(text, len(ids), n_out, ids))
    return rows


# ---------------------------------------------------------------------------- ShareGPT
def sample_sharegpt_requests(
    path: str,
    num_prompts: int,
    tokenizer: Any,
    rng: np.random.Generator,
    fixed_output_len: Optional[int] = None,
    context_len: Optional[int] = None,
) -> list[DatasetRow]:
    """First human turn as the prompt, the reply's length as the output length (shuffled, filtered)."""
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    convs = [d.get("conversations") or d.get("conversation") or [] for d in data if isinstance(d, dict)]
    pairs = [(c[0].get("value", ""), c[1].get("value", "")) for c in convs if len(c) >= 2]
    order = rng.permutation(len(pairs))
    rows: list[DatasetRow] = []
    for idx in order:
        if len(rows) >= num_prompts:
            break
        prompt, completion = pairs[int(idx)]
        ids = encode(tokenizer, prompt)
        out_len = fixed_output_len if fixed_output_len is not None else len(encode(tokenizer, completion))
        if len(ids) < 2 or out_len < 2:
            continue
        if context_len is not None:
            if len(ids) + out_len > context_len:
                continue
        elif fixed_output_len is None and (
            len(ids) > SHAREGPT_MAX_PROMPT_LEN or len(ids) + out_len > SHAREGPT_MAX_TOTAL_LEN
        ):
            continue
        rows.append(DatasetRow(prompt, len(ids), out_len, ids))
    if not rows:
        raise ValueError(f"no usable conversation in {path!r}")
    return rows


# ---------------------------------------------------------------------------- generated shared prefix
def sample_generated_shared_prefix_requests(
    num_groups: int,
    prompts_per_group: int,
    system_prompt_len: int,
    question_len: int,
    output_len: int,
    tokenizer: Any,
    rng: np.random.Generator,
) -> list[DatasetRow]:
    """`num_groups` random system prompts, each shared by `prompts_per_group` random questions (shuffled)."""
    if min(num_groups, prompts_per_group, system_prompt_len, question_len, output_len) < 1:
        raise ValueError("every --gsp-* value must be >= 1")
    vocab = word_token_ids(tokenizer)
    rows = []
    for _ in range(num_groups):
        system, _ids = random_text(tokenizer, system_prompt_len, rng, vocab)
        for _ in range(prompts_per_group):
            question, _qids = random_text(tokenizer, question_len, rng, vocab)
            prompt = f"{system}\n\n{question}"
            ids = encode(tokenizer, prompt)
            rows.append(DatasetRow(prompt, len(ids), output_len, ids))
    return [rows[int(i)] for i in rng.permutation(len(rows))]
