"""`python test/reliability/fault_server.py [launch_server flags]`: the real HTTP server (same
`launch_server`, same processes) whose scheduler ranks carry one injected fault, so that the
suite can provoke what cannot be provoked from outside:

- a prompt that contains token id `HANG_TOKEN` makes the model runner's forward block forever
  (a hung kernel or collective), on every rank.

Fault injection, not a stand-in: everything else is the production code path.
"""

from __future__ import annotations

import sys
import threading

HANG_TOKEN = 451


def faulty_scheduler_entry(server_args, port_args, rank, pipe_writer) -> None:
    """The production scheduler entry with `ModelRunner.forward` wrapped by the fault."""
    from sglang.srt.managers.scheduler.scheduler_process import run_scheduler_process
    from sglang.srt.model_executor.model_runner import ModelRunner

    real_forward = ModelRunner.forward
    never = threading.Event()

    def hanging_forward(self, wb, *args, **kwargs):
        if HANG_TOKEN in wb.input_ids:
            never.wait()  # the hang the watchdog must end
        return real_forward(self, wb, *args, **kwargs)

    ModelRunner.forward = hanging_forward
    run_scheduler_process(server_args, port_args, rank, pipe_writer)


def main(argv: list[str]) -> int:
    from sglang.srt.entrypoints.http_server import launch_server
    from sglang.srt.server_args import prepare_server_args

    server_args = prepare_server_args(argv)
    server_args.validate()
    launch_server(server_args, scheduler_entry=faulty_scheduler_entry)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
