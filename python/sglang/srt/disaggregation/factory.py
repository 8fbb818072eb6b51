"""Build the PD component a scheduler holds (None when --disaggregation-mode is null)."""

from __future__ import annotations

from typing import Optional, Union

from sglang.srt.disaggregation.decode import DecodeDisaggregation
from sglang.srt.disaggregation.prefill import PrefillDisaggregation

Disaggregation = Union[PrefillDisaggregation, DecodeDisaggregation]


def create_disaggregation(server_args, groups, runner, cache) -> Optional[Disaggregation]:
    mode = server_args.disaggregation_mode
    if mode == "prefill":
        return PrefillDisaggregation(server_args, groups, runner, cache)
    if mode == "decode":
        return DecodeDisaggregation(server_args, groups, runner, cache)
    return None
