"""Float32 logits on every default CPU path (issue 32): the default model's first answer must not
depend on a near tie rounded away.

The embedded SmolLM2's chat answer to "What is the capital of France?" starts with a near tie in
float32 ("The" vs "L", about 0.08 apart). bf16 logits keep steps of 1/8 at that magnitude, so on
some CPUs the two came out exactly equal and the tie went to the lower id ("L'Étoile, ..."). For
each CPU kind's `--dtype auto` (forced with SGLANG_CPU_FLAGS_OVERRIDE: what the dtype choice and
its mixed linears do) and each kernel build this machine runs (SGLANG_CPU_ISA), the first token's
logits must rank the candidates as float32 does, within a stated distance of float32's logprobs,
and must not be bf16-rounded; `--disable-fp32-lm-head` shows the rounding it removes. The real
oneDNN instructions of another CPU kind cannot be forced in-process (ONEDNN_MAX_CPU_ISA is read once
per process), so the bf16 GEMMs run this CPU's oneDNN code."""

from __future__ import annotations

import contextlib

import pytest
import torch

from sglang.srt.kernels.cpu import isa
from sglang.srt.model_loader.default_model import find_default_model
from sglang.srt.platforms import cpu, fresh_platforms
from sglang.srt.utils.hf_transformers_utils import get_tokenizer
from sglang.test.scheduler_harness import SchedulerHarness

pytestmark = pytest.mark.slow

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
REAL_FLAGS = isa.cpu_flags() or frozenset()
# kinds this machine can stand in for (its flags include the kind's) and the kernel builds it runs
KINDS = [k for k in cpu.CPU_KINDS if cpu.KIND_FLAGS[k] <= REAL_FLAGS]
BUILDS = [v.name for v in isa.runnable_variants()]
# (kind, build) pairs covering every kind and every build once (the dtype mode follows the kind, the
# LM head's kernel the build): an AVX-512 CPU without BF16 runs the avx512 build, an AVX-512 one may
# be told SGLANG_CPU_ISA=avx2 / portable
PAIRS = [
    ("amx", "avx512bf16"),
    ("avx512-bf16", "avx512bf16"),
    ("avx512", "avx512"),
    ("avx512", "avx2"),
    ("avx512", "portable"),
    ("avx2", "avx2"),
    ("generic", "portable"),
]
RUNNABLE_PAIRS = [(k, b) for k, b in PAIRS if k in KINDS and b in BUILDS]
# bf16 model, float32 logits vs the float32 model: every layer's bf16 rounding moves the logprobs
# by a few hundredths here; the near tie is 0.08 wide
LOGPROB_TOL = 0.05


@pytest.fixture(scope="module")
def prompt():
    path = find_default_model()
    ids = get_tokenizer(path).apply_chat_template(QUESTION, add_generation_prompt=True, tokenize=True)
    return path, list(ids if isinstance(ids, list) else ids["input_ids"])


def _first_logits(path, ids, dtype, **kwargs) -> torch.Tensor:
    h = SchedulerHarness(model_path=path, dtype=dtype, max_total_tokens=2048, num_threads=2, **kwargs)
    rid = h.submit(ids, 1)
    h.run()
    return h.logits[rid][0].float()


@pytest.fixture(scope="module")
def float32_top(prompt):
    path, ids = prompt
    lp = torch.log_softmax(_first_logits(path, ids, "float32"), -1)
    values, order = lp.topk(3)
    assert values[0] - values[1] < 0.15, "the prompt no longer has a near tie: the test would prove nothing"
    return values, order


@pytest.fixture
def cpu_as(monkeypatch):
    """Set the kind and build, then run the rest of the test on fresh platform objects (their
    kernel table and dtype choice follow the variables)."""
    with contextlib.ExitStack() as stack:

        def force(kind: str, build: str) -> None:
            monkeypatch.setenv("SGLANG_CPU_FLAGS_OVERRIDE", kind)
            monkeypatch.setenv("SGLANG_CPU_ISA", build)
            stack.enter_context(fresh_platforms())

        yield force


@pytest.mark.parametrize("kind,build", RUNNABLE_PAIRS)
def test_default_dtype_ranks_the_near_tie_as_float32(prompt, float32_top, cpu_as, kind, build):
    path, ids = prompt
    cpu_as(kind, build)
    logits = _first_logits(path, ids, "auto")
    lp = torch.log_softmax(logits, -1)
    ref_values, ref_order = float32_top
    assert lp.topk(3).indices.tolist() == ref_order.tolist()
    assert torch.allclose(lp[ref_order], ref_values, atol=LOGPROB_TOL), (lp[ref_order], ref_values)
    if cpu.choose_dtype().dtype == torch.bfloat16:  # float32 logits, not bf16 ones widened
        assert not torch.equal(logits, logits.bfloat16().float())


def test_disable_fp32_lm_head_gives_bf16_rounded_logits(prompt, cpu_as):
    """The control: a bf16 kind with --disable-fp32-lm-head returns logits on bf16's grid."""
    path, ids = prompt
    cpu_as("avx512-bf16" if "avx512-bf16" in KINDS else "avx2", BUILDS[0])
    if cpu.choose_dtype().dtype != torch.bfloat16:
        pytest.skip("no bf16 CPU kind on this machine")
    logits = _first_logits(path, ids, "auto", disable_fp32_lm_head=True)
    assert torch.equal(logits, logits.bfloat16().float())
