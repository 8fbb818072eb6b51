"""The bootstrap server over real HTTP (register, topology, health, conflicting registrations) and
the request-side checks of the bootstrap fields."""

from __future__ import annotations


import pytest

from sglang.srt.distributed.init import get_free_port
from sglang.srt.disaggregation.bootstrap import BootstrapServer, is_alive, query_topology, register_rank
from sglang.srt.disaggregation.base.messages import PrefillRankInfo
from sglang.srt.disaggregation.role import DisaggregationRole
from sglang.srt.managers.io_struct import GenerateReqInput
from sglang.srt.managers.tokenizer.request_validation import bootstrap_of, check_bootstrap


def _port() -> int:
    return get_free_port()


def _info(tp_rank: int, cp_rank: int = 0, cp_size: int = 2, dtype: str = "float32") -> PrefillRankInfo:
    return PrefillRankInfo(
        "127.0.0.1",
        5000 + tp_rank,
        "127.0.0.1:1",
        tp_rank,
        1,
        cp_rank,
        cp_size,
        0,
        1,
        0,
        1,
        1,
        dtype,
        "mha",
        0,
        4,
    )


def test_register_and_query():
    port = _port()
    server = BootstrapServer("127.0.0.1", port).start()
    url = f"http://127.0.0.1:{port}"
    try:
        assert is_alive(url)
        assert query_topology(url) is None  # nobody registered yet
        register_rank(url, _info(0, cp_rank=0))
        assert query_topology(url) is None  # cp 2: one rank missing
        register_rank(url, _info(0, cp_rank=1))
        topo = query_topology(url)
        assert [r.key for r in topo.ranks] == [(0, 0, 0, 0), (0, 1, 0, 0)]
        with pytest.raises(RuntimeError, match="disagrees"):
            register_rank(url, _info(0, cp_rank=1, dtype="bfloat16"))
    finally:
        server.close()
    assert not is_alive(url)


def test_bootstrap_fields_checked():
    prefill, decode, normal = (DisaggregationRole(mode) for mode in ("prefill", "decode", "null"))
    ok = GenerateReqInput(text="hi", bootstrap_host="127.0.0.1", bootstrap_port=8998, bootstrap_room=5)
    check_bootstrap(ok, decode, 1)
    assert bootstrap_of(ok, 0) == ("127.0.0.1", 8998, 5)
    check_bootstrap(GenerateReqInput(text="hi"), normal, 1)  # a normal server ignores them
    with pytest.raises(ValueError, match="needs bootstrap_host"):
        check_bootstrap(GenerateReqInput(text="hi"), prefill, 1)
    with pytest.raises(ValueError, match="bootstrap_room"):
        check_bootstrap(GenerateReqInput(text="hi", bootstrap_host="h", bootstrap_room=-1), decode, 1)
    with pytest.raises(ValueError, match="n > 1"):
        check_bootstrap(ok, decode, 2)
    batch = GenerateReqInput(text=["a", "b"], bootstrap_host="h", bootstrap_room=[1, 2])
    check_bootstrap(batch, prefill, 2)
    assert bootstrap_of(batch, 1) == ("h", None, 2)
    with pytest.raises(ValueError, match="one entry per prompt"):
        check_bootstrap(GenerateReqInput(text=["a", "b"], bootstrap_host="h", bootstrap_room=[1]), prefill, 2)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(disaggregation_mode="bogus"), "--disaggregation-mode must be one of"),
        (
            dict(disaggregation_mode="prefill", disaggregation_transfer_backend="nixl"),
            "--disaggregation-transfer-backend",
        ),
        (
            dict(disaggregation_mode="prefill", disaggregation_bootstrap_port=0),
            "--disaggregation-bootstrap-port",
        ),
        (dict(disaggregation_mode="prefill", disaggregation_bootstrap_port=30000), "must differ from --port"),
        (
            dict(disaggregation_mode="decode", tp_size=2, pp_size=2, dp_size=2, enable_dp_attention=True),
            "decode with --pp-size > 1 and --dp-size > 1",
        ),
        (dict(disaggregation_mode="prefill", enable_dp_attention=True), "prefill with --dp-size"),
        (
            dict(disaggregation_mode="prefill", tp_size=2, dp_size=2, enable_dp_attention=True),
            "prefill with --dp-size",
        ),
    ],
)
def test_bad_disaggregation_flags_are_clear_errors(kwargs, match):
    from sglang.srt.server_args import ServerArgs

    with pytest.raises(ValueError, match=match):
        ServerArgs(**kwargs).validate()


def test_decode_with_attention_dp_is_accepted():
    """The seeds' decode layout (dp attention + ep), decode pp, prefill cp x pp validate; prefill dp
    and decode pp x dp are refused by name (above)."""
    from sglang.srt.server_args import ServerArgs

    args = ServerArgs(disaggregation_mode="decode", tp_size=2, dp_size=2, enable_dp_attention=True, ep_size=2)
    args.validate()
    ServerArgs(disaggregation_mode="prefill", cp_size=2, pp_size=2).validate()
    ServerArgs(disaggregation_mode="decode", pp_size=2).validate()


def test_upstream_flag_names_and_defaults():
    from sglang.srt.server_args import prepare_server_args

    args = prepare_server_args([])
    assert (
        args.disaggregation_mode,
        args.disaggregation_transfer_backend,
        args.disaggregation_bootstrap_port,
        args.disaggregation_ib_device,
        args.num_reserved_decode_tokens,
    ) == ("null", "mooncake", 8998, None, 512)
    args = prepare_server_args(["--disaggregation-mode", "decode", "--disaggregation-ib-device", "mlx5_0"])
    assert args.disaggregation_mode == "decode" and args.disaggregation_ib_device == "mlx5_0"
