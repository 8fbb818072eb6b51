"""Flags of the DSA backend: `--attention-backend dsa` / `nsa`, `--nsa-prefill-backend` /
`--nsa-decode-backend` (and their `--dsa-*` spellings), `--enable-shard-linear`: parsing, the clear
ValueErrors of `ServerArgs.validate`, `--help` text, and which op implementation the backend runs."""

from __future__ import annotations

import types

import pytest

from sglang.srt.entrypoints.cli import check_server_args
from sglang.srt.layers.attention.dsa.backend_names import nsa_backend_choices, resolve_nsa_backend
from sglang.srt.layers.attention.registry import canonical_attention_backend, get_attention_backend_class
from sglang.srt.server_args import ServerArgs, prepare_server_args

BASE = dict(model_path="x", load_format="dummy")


def test_nsa_alias_and_backend_class():
    assert canonical_attention_backend("nsa") == "dsa"
    cls = get_attention_backend_class("nsa")
    assert cls.name == "dsa" and cls.supports_mla and cls.supports_context_parallel


def test_flags_parse_with_both_spellings():
    a = prepare_server_args(
        [
            "--model-path",
            "x",
            "--load-format",
            "dummy",
            "--attention-backend",
            "nsa",
            "--dsa-prefill-backend",
            "flashmla_sparse",
            "--nsa-decode-backend",
            "cpu",
        ]
    )
    assert (a.nsa_prefill_backend, a.nsa_decode_backend) == ("flashmla_sparse", "cpu")
    check_server_args(a)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(attention_backend="dsa", nsa_prefill_backend="flash_magic"), "--nsa-prefill-backend: unknown"),
        (dict(nsa_decode_backend="cpu"), "applies to --attention-backend dsa"),
        (
            dict(attention_backend="torch_native", nsa_prefill_backend="reference"),
            "applies to --attention-backend",
        ),
        (dict(enable_shard_linear=True), "needs --cp-size > 1"),
        (dict(enable_shard_linear=True, cp_size=2, tp_size=4), "attention TP 1"),
    ],
)
def test_bad_flags_are_clear_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        check_server_args(ServerArgs(**BASE, **kwargs))


def test_help_documents_the_flags(capsys):
    with pytest.raises(SystemExit):
        prepare_server_args(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "--enable-shard-linear" in out and "q_b_proj and o_proj" in out
    assert "--nsa-prefill-backend" in out and "flashmla_sparse" in out


def test_upstream_names_map():
    assert resolve_nsa_backend(None) == "auto"
    assert resolve_nsa_backend("flashmla_sparse") == resolve_nsa_backend("fa3") == "triton"
    assert resolve_nsa_backend("ascend") == "torch_npu"
    assert {"auto", "reference", "cpu", "triton", "torch_npu", "tilelang"} <= set(nsa_backend_choices())


def test_backend_picks_the_platform_impl_or_the_flags():
    from sglang.srt.layers.attention.dsa_backend import DSAAttnBackend

    runner = types.SimpleNamespace(server_args=ServerArgs(**BASE, attention_backend="dsa"))
    b = DSAAttnBackend(runner)
    assert (b.kernels.prefill_impl, b.kernels.decode_impl) == (
        "cpu",
        "cpu",
    )  # the CPU platform's fused kernels
    runner = types.SimpleNamespace(
        server_args=ServerArgs(
            **BASE, attention_backend="dsa", nsa_prefill_backend="fa3", nsa_decode_backend="reference"
        )
    )
    b = DSAAttnBackend(runner)
    assert (b.kernels.prefill_impl, b.kernels.decode_impl) == ("triton", "reference")
