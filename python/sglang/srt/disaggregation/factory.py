"""Build a rank's PD pieces once, from the flags: the component its scheduler holds
(`create_disaggregation`, by --disaggregation-mode), the KV sender / receiver of a later pipeline
stage of a prefill / decode server (`create_stage_transfer`), and for both the rank's one KV
manager (`create_kv_manager`, by --disaggregation-transfer-backend: one of `BACKENDS`).

A decode server's stages meet once at start-up (`_link_decode_stages`: one object all-gather over
the pipeline group, stage 0 in `create_disaggregation`, stage k in `create_stage_transfer`)."""

from __future__ import annotations

from typing import Callable, Optional, Union

from sglang.srt.disaggregation.base.conn import BaseKVManager, KVBackend, KVManagerArgs
from sglang.srt.disaggregation.bootstrap import HttpBootstrapClient
from sglang.srt.disaggregation.common import kv_kind, pd_ip, pool_regions, rank_place
from sglang.srt.disaggregation.component import Disaggregation, NullDisaggregation
from sglang.srt.disaggregation.decode import DecodeDisaggregation
from sglang.srt.disaggregation.decode_stage import StageDecodeReceiver
from sglang.srt.disaggregation.fake.conn import FakeBackend
from sglang.srt.disaggregation.mooncake.backend import MooncakeBackend
from sglang.srt.disaggregation.prefill import PrefillDisaggregation
from sglang.srt.disaggregation.prefill_stage import StagePrefillTransfer

# --disaggregation-transfer-backend -> its backend (a new one: a folder implementing base/, added here)
BACKENDS: dict[str, Callable[[], KVBackend]] = {"mooncake": MooncakeBackend, "fake": FakeBackend}
WILDCARD_HOSTS = ("0.0.0.0", "::", "")


def create_disaggregation(server_args, groups, runner, cache) -> Disaggregation:
    mode = server_args.disaggregation_mode
    if mode == "prefill":
        manager = create_kv_manager("prefill", server_args, groups, runner)
        return PrefillDisaggregation(groups, runner, cache, manager, FakeBackend().prefill_manager())
    if mode == "decode":
        manager = create_kv_manager("decode", server_args, groups, runner)
        if groups.pp.size > 1 and _moves_kv(server_args):
            manager.set_later_stages(_link_decode_stages(groups, manager)[1:])
        return DecodeDisaggregation(
            server_args, groups, runner, cache, manager, FakeBackend().decode_manager()
        )
    return NullDisaggregation()


def create_stage_transfer(
    server_args, groups, runner
) -> Optional[Union[StagePrefillTransfer, StageDecodeReceiver]]:
    """A PD server's pipeline stage k > 0: what sends (prefill) or receives (decode) this stage's
    layers' KV (None on other servers, and with a backend that moves no KV)."""
    mode = server_args.disaggregation_mode
    if mode == "null" or not _moves_kv(server_args):
        return None
    if mode == "decode":
        manager = create_kv_manager("decode", server_args, groups, runner)
        _link_decode_stages(groups, manager)
        return StageDecodeReceiver(runner, manager)
    manager = create_kv_manager("prefill", server_args, groups, runner)
    return StagePrefillTransfer(runner, manager, cp_rank=groups.attn_cp.rank)


def _moves_kv(server_args) -> bool:
    return BACKENDS[server_args.disaggregation_transfer_backend]().moves_kv


def _link_decode_stages(groups, manager) -> list[Optional[str]]:
    """Every stage's address of this tp rank (collective over the pipeline group)."""
    return groups.pp.all_gather_object(manager.stage_address())


def create_kv_manager(side: str, server_args, groups, runner) -> BaseKVManager:
    """The one place a rank's KV manager is built (and started): `side` "prefill" or "decode"."""
    backend = BACKENDS[server_args.disaggregation_transfer_backend]()
    args = kv_manager_args(side, server_args, groups, runner)
    return backend.prefill_manager(args) if side == "prefill" else backend.decode_manager(args)


def kv_manager_args(side: str, server_args, groups, runner) -> KVManagerArgs:
    place = rank_place(groups)
    pool = runner.token_to_kv_pool
    bootstrap_url = ""
    if side == "prefill":  # this server's bootstrap server (started by the entrypoint)
        host = "127.0.0.1" if server_args.host in WILDCARD_HOSTS else server_args.host
        bootstrap_url = f"http://{host}:{server_args.disaggregation_bootstrap_port}"
    return KVManagerArgs(
        place=place,
        ip=pd_ip(server_args.host),
        regions=pool_regions(pool, runner.model_config.num_key_value_heads, place),
        kv_dtype=str(pool.dtype).replace("torch.", ""),
        page_size=server_args.page_size,
        kv_kind=kv_kind(pool),
        start_layer=pool.start_layer,
        end_layer=pool.end_layer,
        ib_device=server_args.disaggregation_ib_device,
        bootstrap=HttpBootstrapClient(),
        bootstrap_url=bootstrap_url,
    )
