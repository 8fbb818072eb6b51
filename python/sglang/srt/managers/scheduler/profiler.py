"""SchedulerProfiler: torch.profiler on one scheduler rank, driven by `ProfileReqInput` control
messages (/start_profile, /stop_profile). Every rank of a replica applies the same message (the
entry rank broadcasts them), so each writes its own trace:
`<output_dir>/<profile_id>-rank<world rank>.trace.json` (Chrome trace format, opens in Perfetto
or chrome://tracing). Later pipeline stages run no scheduler and are not profiled.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Optional

from sglang.srt.managers.io_struct import ProfileReqInput, ProfileReqOutput

logger = logging.getLogger(__name__)


class SchedulerProfiler:
    def __init__(self, world_rank: int):
        self.world_rank = world_rank
        self.prof: Optional[Any] = None  # the running torch.profiler.profile
        self.path: Optional[str] = None
        self.steps_left: Optional[int] = None

    @property
    def active(self) -> bool:
        return self.prof is not None

    def handle(self, msg: ProfileReqInput) -> ProfileReqOutput:
        if msg.action == "start":
            return self.start(msg)
        if msg.action == "stop":
            return self.stop()
        return ProfileReqOutput(False, f"unknown profile action {msg.action!r}")

    def start(self, msg: ProfileReqInput) -> ProfileReqOutput:
        if self.prof is not None:
            return ProfileReqOutput(False, "the profiler is already running (POST /stop_profile first)")
        import torch.profiler as tp

        kinds = {"CPU": tp.ProfilerActivity.CPU}
        unknown = [a for a in msg.activities if a.upper() not in kinds]
        if unknown:
            return ProfileReqOutput(False, f"profiler activities {unknown} are not available here (CPU only)")
        try:
            os.makedirs(msg.output_dir, exist_ok=True)
        except OSError as err:
            return ProfileReqOutput(False, f"cannot create output_dir {msg.output_dir!r}: {err}")
        self.path = os.path.join(msg.output_dir, f"{msg.profile_id}-rank{self.world_rank}.trace.json")
        self.prof = tp.profile(
            activities=[kinds[a.upper()] for a in msg.activities],
            with_stack=msg.with_stack,
            record_shapes=msg.record_shapes,
        )
        self.prof.start()
        self.steps_left = msg.num_steps
        logger.info("profiling started (trace: %s)", self.path)
        return ProfileReqOutput(True, self.path)

    def stop(self) -> ProfileReqOutput:
        if self.prof is None:
            return ProfileReqOutput(False, "the profiler is not running (POST /start_profile first)")
        prof, path = self.prof, self.path
        self.prof = self.path = self.steps_left = None
        prof.stop()
        prof.export_chrome_trace(path)
        logger.info("profiling stopped: trace written to %s", path)
        return ProfileReqOutput(True, path)

    def on_step(self) -> None:
        """A forward step finished: a profile started with `num_steps` stops after its last one."""
        if self.steps_left is None:
            return
        self.steps_left -= 1
        if self.steps_left <= 0:
            self.stop()
