"""`with step_label("runner.model"):` names a part of a scheduler step in a torch.profiler trace
(/start_profile; `benchmark/vs_vllm/step_breakdown.py` sorts a trace's time by these names).

When no profiler runs it costs one flag check (~0.2 us; `torch.profiler.record_function` costs
several us even then). A label entered before the profiler started is not recorded; one that the
profiler outlives is closed normally (the profiler starts and stops between messages, inside a step).
"""

from __future__ import annotations

from typing import Optional

import torch
from torch.autograd.profiler import record_function


class step_label:  # noqa: N801 (used like a function: `with step_label(...)`)
    __slots__ = ("name", "_rf")

    def __init__(self, name: str):
        self.name = name
        self._rf: Optional[record_function] = None

    def __enter__(self) -> None:
        if torch.autograd.profiler._is_profiler_enabled:
            self._rf = record_function(self.name)
            self._rf.__enter__()

    def __exit__(self, *exc) -> None:
        if self._rf is not None:
            self._rf.__exit__(*exc)
            self._rf = None
