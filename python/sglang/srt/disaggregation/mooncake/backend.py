"""`--disaggregation-transfer-backend mooncake`: a rank's transfer engine (its KV pool registered
once) and its manager, started."""

from __future__ import annotations

from sglang.srt.disaggregation.base.conn import KVBackend, KVManagerArgs
from sglang.srt.disaggregation.mooncake.data_plane import start_data_plane
from sglang.srt.disaggregation.mooncake.decode_conn import MooncakeDecodeKVManager
from sglang.srt.disaggregation.mooncake.prefill_conn import MooncakePrefillKVManager


class MooncakeBackend(KVBackend):
    @property
    def moves_kv(self) -> bool:
        return True

    def prefill_manager(self, args: KVManagerArgs) -> MooncakePrefillKVManager:
        manager = MooncakePrefillKVManager(args, start_data_plane(args.ip, args.ib_device, args.regions))
        manager.start()
        return manager

    def decode_manager(self, args: KVManagerArgs) -> MooncakeDecodeKVManager:
        manager = MooncakeDecodeKVManager(args, start_data_plane(args.ip, args.ib_device, args.regions))
        manager.start()
        return manager
