"""SamplingBatchInfo: the sampling parameters of one batch as tensors, plus logit processing.

Built once per forward step by the model runner from the requests' `SamplingParams` (already
verified and normalized) and their token histories. Everything that is not needed by the batch is
skipped: penalty bookkeeping ([bs, vocab] output counts for frequency / presence, a sparse
(row, token) index for repetition) is built lazily on first use and only when a penalty is
active, and the `need_*` flags let the sampler skip top-k / top-p / min-p work.

Penalty semantics (applied in this order, in place, on float32 logits):
  1. repetition (HF rule) over prompt + output tokens: positive logits / r, negative logits * r;
  2. frequency over output tokens: logits -= f * count;
  3. presence over output tokens: logits -= p * (count > 0).
Then `apply_biases` adds `logit_bias` and, while a request has fewer than `min_new_tokens` output
tokens, masks its EOS / stop token ids to -inf. Last, `apply_vocab_mask` sets every token a
request's grammar does not allow to -inf (constrained decoding: `vocab_mask`, one int32 bitmask row
per request, bit j of word i = token 32 i + j allowed; built by the scheduler's GrammarManager), so
greedy and sampled rows both pick an allowed token.

Random numbers: a row whose request has a `seed` draws from its own generator, seeded with
`mix_seed(seed, len(output_ids))`, so its token depends only on (seed, tokens generated so far) and
its probabilities, not on the rest of the batch. Other rows share the sampler's generator. A caller
that wants every row reproducible (e.g. so that all TP ranks agree without a broadcast) passes
`step_seeds`: one exact generator seed per row for this step, overriding both rules.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

import torch

from sglang.srt.sampling.sampling_params import SamplingParams

_MASK64 = (1 << 64) - 1


def mix_seed(seed: int, step: int) -> int:
    """Deterministic 63-bit seed from (seed, step) (splitmix64 finaliser; process-independent)."""
    x = (int(seed) * 0x9E3779B97F4A7C15 + int(step) + 0x632BE59BD9B4E019) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (x ^ (x >> 31)) & ((1 << 63) - 1)


@dataclass
class SamplingBatchInfo:
    """Batched sampling parameters. Per-row tensors live on `device`."""

    vocab_size: int
    device: torch.device
    temperatures: torch.Tensor  # [bs, 1] float32 (1.0 for greedy rows)
    top_ps: torch.Tensor  # [bs] float32
    top_ks: torch.Tensor  # [bs] int64, vocab_size for "whole vocabulary"
    min_ps: torch.Tensor  # [bs] float32
    is_greedy: torch.Tensor  # [bs] bool
    frequency_penalties: torch.Tensor  # [bs, 1] float32
    presence_penalties: torch.Tensor  # [bs, 1] float32
    repetition_penalties: torch.Tensor  # [bs, 1] float32
    # Python-side summaries so the hot path never syncs with the device.
    greedy_rows: list[bool]
    all_greedy: bool
    need_top_k: bool  # some sampled row keeps fewer than vocab_size tokens
    need_top_p: bool
    need_min_p: bool
    all_top_k_limited: bool  # every sampled row has top_k < vocab_size (topk instead of sort)
    need_freq_presence: bool
    need_repetition: bool
    # Per row: exact generator seed for this step, or None for the shared generator.
    row_seeds: list[Optional[int]]
    output_ids: Sequence[Sequence[int]]
    prompt_ids: Sequence[Sequence[int]]
    # Sparse additions: (rows, cols, values) of logit_bias and (rows, cols) of min-token masks.
    bias_index: Optional[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = None
    min_tokens_mask: Optional[tuple[torch.Tensor, torch.Tensor]] = None
    vocab_mask: Optional[torch.Tensor] = None  # [bs, ceil(V / 32)] int32 grammar bitmask
    _output_counts: Optional[torch.Tensor] = field(default=None, repr=False)
    _seen_index: Optional[tuple[torch.Tensor, torch.Tensor]] = field(default=None, repr=False)

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_params(
        cls,
        params: Sequence[SamplingParams],
        output_ids: Sequence[Sequence[int]],
        prompt_ids: Sequence[Sequence[int]],
        vocab_size: int,
        device: str | torch.device = "cpu",
        step_seeds: Optional[Sequence[int]] = None,
        eos_token_ids: Optional[Sequence[int]] = None,
        vocab_mask: Optional[torch.Tensor] = None,
    ) -> "SamplingBatchInfo":
        """Batch the parameters of `params` (one per row; normalized SamplingParams).

        `eos_token_ids` (optional) are masked, with each request's `stop_token_ids`, for rows that
        have generated fewer than `min_new_tokens` tokens (unless `ignore_eos`, then only the
        request's own stop ids are masked). `vocab_mask`: the rows' grammar bitmask (None: none).
        """
        bs = len(params)
        if len(output_ids) != bs or len(prompt_ids) != bs:
            raise ValueError("params, output_ids and prompt_ids must have one entry per row")
        if step_seeds is not None and len(step_seeds) != bs:
            raise ValueError("step_seeds must have one entry per row")
        device = torch.device(device)
        greedy = [p.is_greedy for p in params]
        temps = [1.0 if g else float(p.temperature) for p, g in zip(params, greedy)]
        top_ks = [vocab_size if (p.top_k < 0 or p.top_k > vocab_size) else p.top_k for p in params]
        sampled = [i for i in range(bs) if not greedy[i]]
        need_top_k = any(top_ks[i] < vocab_size for i in sampled)
        if step_seeds is not None:
            row_seeds: list[Optional[int]] = [int(s) for s in step_seeds]
        else:
            row_seeds = [
                None if p.seed is None else mix_seed(p.seed, len(out)) for p, out in zip(params, output_ids)
            ]

        def col(values: list[float]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.float32, device=device).view(bs, 1)

        info = cls(
            vocab_size=vocab_size,
            device=device,
            temperatures=col(temps),
            top_ps=torch.tensor([p.top_p for p in params], dtype=torch.float32, device=device),
            top_ks=torch.tensor(top_ks, dtype=torch.int64, device=device),
            min_ps=torch.tensor([p.min_p for p in params], dtype=torch.float32, device=device),
            is_greedy=torch.tensor(greedy, dtype=torch.bool, device=device),
            frequency_penalties=col([p.frequency_penalty for p in params]),
            presence_penalties=col([p.presence_penalty for p in params]),
            repetition_penalties=col([p.repetition_penalty for p in params]),
            greedy_rows=greedy,
            all_greedy=len(sampled) == 0,
            need_top_k=need_top_k,
            need_top_p=any(params[i].top_p < 1.0 for i in sampled),
            need_min_p=any(params[i].min_p > 0.0 for i in sampled),
            all_top_k_limited=need_top_k and all(top_ks[i] < vocab_size for i in sampled),
            need_freq_presence=any(p.frequency_penalty != 0.0 or p.presence_penalty != 0.0 for p in params),
            need_repetition=any(p.repetition_penalty != 1.0 for p in params),
            row_seeds=row_seeds,
            output_ids=output_ids,
            prompt_ids=prompt_ids,
        )
        info.bias_index = _build_bias(params, vocab_size, device)
        info.min_tokens_mask = _build_min_tokens_mask(params, output_ids, eos_token_ids, vocab_size, device)
        if vocab_mask is not None:
            if vocab_mask.shape[0] != bs:
                raise ValueError("vocab_mask must have one row per request")
            info.vocab_mask = vocab_mask.to(device)
        return info

    @property
    def batch_size(self) -> int:
        return len(self.greedy_rows)

    @property
    def needs_logit_processing(self) -> bool:
        """True when `apply_penalties` / `apply_biases` would change the logits."""
        return (
            self.need_freq_presence
            or self.need_repetition
            or self.bias_index is not None
            or self.min_tokens_mask is not None
            or self.vocab_mask is not None
        )

    @property
    def has_seeded_rows(self) -> bool:
        return any(s is not None for s in self.row_seeds)

    # ------------------------------------------------------------------ token statistics (lazy)
    def output_counts(self, width: Optional[int] = None) -> torch.Tensor:
        """[bs, width] float32: how often each token occurs in each row's output so far."""
        width = width or self.vocab_size
        if self._output_counts is None or self._output_counts.shape[1] != width:
            self._output_counts = _count_tokens(self.output_ids, self.batch_size, width, self.device)
        return self._output_counts

    def seen_index(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(rows, token ids) of every prompt and output token, repeats included (sparse)."""
        if self._seen_index is None:
            rows = [list(p) + list(o) for p, o in zip(self.prompt_ids, self.output_ids)]
            self._seen_index = _flat_index(rows, self.device)
        return self._seen_index

    # ------------------------------------------------------------------ logit processing
    def apply_penalties(self, logits: torch.Tensor) -> None:
        """Apply repetition, frequency and presence penalties in place to float32 [bs, V] logits."""
        width = logits.shape[1]
        if self.need_repetition:
            # Sparse over the seen tokens: gather once, so repeated ids are penalised once.
            rows, cols = self.seen_index()
            keep = (cols >= 0) & (cols < width)
            rows, cols = rows[keep], cols[keep]
            vals = logits[rows, cols]
            r = self.repetition_penalties.view(-1)[rows]
            logits[rows, cols] = torch.where(vals > 0, vals / r, vals * r)
        if self.need_freq_presence:
            counts = self.output_counts(width)
            logits.sub_(self.frequency_penalties * counts)
            logits.sub_(self.presence_penalties * (counts > 0).to(logits.dtype))

    def apply_biases(self, logits: torch.Tensor) -> None:
        """Add logit_bias and mask EOS / stop ids of rows below min_new_tokens, in place."""
        if self.bias_index is not None:
            rows, cols, vals = self.bias_index
            keep = cols < logits.shape[1]
            logits.index_put_((rows[keep], cols[keep]), vals[keep], accumulate=True)
        if self.min_tokens_mask is not None:
            rows, cols = self.min_tokens_mask
            keep = cols < logits.shape[1]
            logits[rows[keep], cols[keep]] = float("-inf")

    def apply_vocab_mask(self, logits: torch.Tensor) -> None:
        """Set the tokens each row's grammar does not allow to -inf, in place: xgrammar's kernel
        where it is installed and the logits are contiguous float32, else `unpack_bitmask` (the
        same result)."""
        if self.vocab_mask is None:
            return
        apply_token_bitmask_inplace = _xgrammar_apply_bitmask()
        if (
            apply_token_bitmask_inplace is not None
            and logits.dtype == torch.float32
            and logits.is_contiguous()
        ):
            apply_token_bitmask_inplace(logits, self.vocab_mask, vocab_size=logits.shape[1])
            words = self.vocab_mask.shape[1]
            if words * 32 < logits.shape[1]:  # past the mask: not allowed (as unpack_bitmask)
                logits[:, words * 32 :] = float("-inf")
            return
        logits.masked_fill_(~unpack_bitmask(self.vocab_mask, logits.shape[1]), float("-inf"))

    def process_logits(self, logits: torch.Tensor) -> None:
        """All in-place logit processing of this batch (penalties, then biases, then the grammar)."""
        self.apply_penalties(logits)
        self.apply_biases(logits)
        self.apply_vocab_mask(logits)


@functools.lru_cache(maxsize=1)
def _xgrammar_apply_bitmask() -> Optional[Callable[..., None]]:
    """xgrammar's in-place bitmask kernel, looked up once per process (None without xgrammar)."""
    try:
        from xgrammar import apply_token_bitmask_inplace
    except ImportError:
        return None
    return apply_token_bitmask_inplace


def unpack_bitmask(bitmask: torch.Tensor, width: int) -> torch.Tensor:
    """[bs, width] bool of an int32 [bs, words] bitmask (bit j of word i: token 32 i + j); tokens
    past the mask's words are not allowed."""
    shifts = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    bits = ((bitmask.to(torch.int32).unsqueeze(-1) >> shifts) & 1).view(bitmask.shape[0], -1)
    if bits.shape[1] < width:
        bits = torch.nn.functional.pad(bits, (0, width - bits.shape[1]))
    return bits[:, :width].bool()


# ---------------------------------------------------------------------- builders
def _flat_index(rows: Sequence[Sequence[int]], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(row index, token id) int64 tensors of every token of every row."""
    row_of = [i for i, r in enumerate(rows) for _ in r]
    ridx = torch.tensor(row_of, dtype=torch.int64, device=device)
    cols = torch.tensor([t for r in rows for t in r], dtype=torch.int64, device=device)
    return ridx, cols


def _count_tokens(rows: Sequence[Sequence[int]], bs: int, width: int, device: torch.device) -> torch.Tensor:
    counts = torch.zeros(bs, width, dtype=torch.float32, device=device)
    ridx, cols = _flat_index(rows, device)
    keep = (cols >= 0) & (cols < width)
    ones = torch.ones(int(keep.sum()), dtype=torch.float32, device=device)
    counts.index_put_((ridx[keep], cols[keep]), ones, accumulate=True)
    return counts


def _build_bias(
    params: Sequence[SamplingParams], vocab_size: int, device: torch.device
) -> Optional[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    rows, cols, vals = [], [], []
    for i, p in enumerate(params):
        for key, bias in (p.logit_bias or {}).items():
            tid = int(key)
            if 0 <= tid < vocab_size and bias != 0.0:
                rows.append(i)
                cols.append(tid)
                vals.append(float(bias))
    if not rows:
        return None
    return (
        torch.tensor(rows, dtype=torch.int64, device=device),
        torch.tensor(cols, dtype=torch.int64, device=device),
        torch.tensor(vals, dtype=torch.float32, device=device),
    )


def _build_min_tokens_mask(
    params: Sequence[SamplingParams],
    output_ids: Sequence[Sequence[int]],
    eos_token_ids: Optional[Sequence[int]],
    vocab_size: int,
    device: torch.device,
) -> Optional[tuple[torch.Tensor, torch.Tensor]]:
    rows, cols = [], []
    for i, (p, out) in enumerate(zip(params, output_ids)):
        if len(out) >= p.min_new_tokens:
            continue
        blocked = set(p.stop_token_ids or [])
        if not p.ignore_eos:
            blocked.update(eos_token_ids or [])
        for tid in sorted(blocked):
            if 0 <= tid < vocab_size:
                rows.append(i)
                cols.append(tid)
    if not rows:
        return None
    return (
        torch.tensor(rows, dtype=torch.int64, device=device),
        torch.tensor(cols, dtype=torch.int64, device=device),
    )
