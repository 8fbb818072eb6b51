"""Start the scheduler, detokenizer (and, with attention DP, data-parallel controller) processes,
wait until they are ready, watch them.

Used by both the offline `Engine` and the HTTP server. Children are started with the spawn
context, watch their parent (they exit when it dies) and are stopped with `ChildProcesses.terminate`.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import shutil
import signal
import threading
import traceback
from multiprocessing.connection import wait as mp_wait
from typing import Any, Callable, Optional

from sglang.srt.managers.io_struct import SchedulerReadyInfo
from sglang.srt.managers.scheduler.scheduler_watchdog import WATCHDOG_EXIT_CODE
from sglang.srt.managers.tokenizer.detok_tokenizer import DetokTokenizerSpec, detok_tokenizer_spec
from sglang.srt.platforms.launch_defaults import child_context, detokenizer_context
from sglang.srt.server_args import PortArgs, ServerArgs
from sglang.srt.utils.process import kill_itself_when_parent_died, kill_process_tree, set_process_name

logger = logging.getLogger(__name__)

READY_POLL_S = 0.5
TERMINATE_GRACE_S = 5.0


# ---------------------------------------------------------------------------- child entries
def _ignore_sigint() -> None:
    """Ctrl+C reaches the whole process group: only the parent reacts, then stops the children."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _child_start(name: str, env: Optional[dict], launcher: Optional[int]) -> None:
    """First thing in every child: the launcher's environment (a fork-server child has the fork
    server's, from its start), the process name, Ctrl+C to the parent only, and exit when the
    launcher dies (a fork-server child's own parent is the fork server)."""
    if env is not None:
        os.environ.clear()
        os.environ.update(env)
    set_process_name(name)
    _ignore_sigint()
    kill_itself_when_parent_died(parent_pid=launcher)


def _scheduler_entry(
    server_args: ServerArgs,
    port_args: PortArgs,
    rank: int,
    pipe_writer: Any,
    entry: Optional[Callable[..., None]] = None,
    env: Optional[dict] = None,
    launcher: Optional[int] = None,
) -> None:
    """Scheduler process: die with the parent, then run the scheduler (or a test double)."""
    from sglang.srt.utils.process import configure_logger

    _child_start(f"sglang-rank{rank}", env, launcher)
    configure_logger(server_args.log_level, f"Scheduler rank {rank}")
    try:
        if entry is None:
            from sglang.srt.managers.scheduler.scheduler_process import run_scheduler_process as entry
        entry(server_args, port_args, rank, pipe_writer)
    except Exception:
        # Harmless if the scheduler already reported (the launcher reads one message only).
        try:
            pipe_writer.send({"status": "error", "error": traceback.format_exc()})
        except OSError:
            pass
        raise


def _dp_controller_entry(
    server_args: ServerArgs, port_args: PortArgs, env: Optional[dict] = None, launcher: Optional[int] = None
) -> None:
    _child_start("sglang-dp-ctrl", env, launcher)
    from sglang.srt.managers.dp.dp_controller import run_data_parallel_controller_process

    run_data_parallel_controller_process(server_args, port_args)


def _detokenizer_entry(
    server_args: ServerArgs,
    port_args: PortArgs,
    tokenizer_spec: Optional[DetokTokenizerSpec],
    env: Optional[dict] = None,
    launcher: Optional[int] = None,
) -> None:
    _child_start("sglang-detok", env, launcher)
    from sglang.srt.managers.tokenizer.detokenizer_manager import run_detokenizer_process

    run_detokenizer_process(server_args, port_args, tokenizer_spec)


# ---------------------------------------------------------------------------- process set
class ChildProcesses:
    """The processes of one engine: watchdog and clean termination."""

    def __init__(self, port_args: PortArgs):
        self.port_args = port_args
        self.procs: list[tuple[str, mp.process.BaseProcess]] = []
        self.stopping = False
        self.watchdog: Optional[threading.Thread] = None

    def add(self, name: str, proc: mp.process.BaseProcess) -> None:
        self.procs.append((name, proc))

    @property
    def pids(self) -> list[int]:
        return [p.pid for _, p in self.procs if p.pid is not None]

    def dead(self) -> list[tuple[str, mp.process.BaseProcess]]:
        return [(n, p) for n, p in self.procs if p.exitcode is not None]

    def start_watchdog(self, on_death: Callable[[str], None]) -> None:
        """Call `on_death(message)` (once, from a daemon thread) if any child exits unexpectedly."""

        def loop() -> None:
            while not self.stopping:
                sentinels = [p.sentinel for _, p in self.procs]
                mp_wait(sentinels, timeout=1.0)
                if self.stopping:
                    return
                dead = self.dead()
                if dead:
                    message = death_message(dead)
                    logger.error(message)
                    on_death(message)
                    return

        self.watchdog = threading.Thread(target=loop, name="child-watchdog", daemon=True)
        self.watchdog.start()

    def terminate(self, grace_s: float = TERMINATE_GRACE_S) -> None:
        """SIGTERM every child (and its descendants), SIGKILL what is left after `grace_s`."""
        self.stopping = True
        for _, proc in self.procs:
            if proc.pid is not None and proc.exitcode is None:
                kill_process_tree(proc.pid, include_self=True, sig=signal.SIGTERM)
        for _, proc in self.procs:
            proc.join(timeout=grace_s)
            if proc.exitcode is None and proc.pid is not None:
                kill_process_tree(proc.pid, include_self=True, sig=signal.SIGKILL)
                proc.join(timeout=grace_s)
        ipc_dir = _ipc_dir(self.port_args)
        if ipc_dir:
            shutil.rmtree(ipc_dir, ignore_errors=True)


def death_message(dead: list[tuple[str, mp.process.BaseProcess]]) -> str:
    """Which child died, first the one that most likely died first: when one rank is killed its
    peers fail in their next collective and exit with an error soon after, often before the
    watchdog looks, so a death by signal or by watchdog timeout comes before an exit with an
    error; the others are listed after it."""

    def cause_rank(item: tuple[str, mp.process.BaseProcess]) -> int:
        code = item[1].exitcode
        return 0 if code is not None and (code < 0 or code == WATCHDOG_EXIT_CODE) else 1

    ordered = sorted(dead, key=cause_rank)  # stable: the launch order breaks ties
    name, proc = ordered[0]
    message = f"{name} process (pid {proc.pid}) exited unexpectedly with code {proc.exitcode}{exit_reason(proc.exitcode)}"
    if len(ordered) > 1:
        others = ", ".join(f"{n} (code {p.exitcode})" for n, p in ordered[1:])
        message += f"; also exited: {others}"
    return message


def exit_reason(exitcode: Optional[int]) -> str:
    """Why a child exited, when its exit code tells: a watchdog timeout or a signal."""
    if exitcode == WATCHDOG_EXIT_CODE:
        return " (watchdog timeout: a forward step did not finish within --watchdog-timeout; its log says where it hung)"
    if exitcode is not None and exitcode < 0:
        try:
            return f" (killed by {signal.Signals(-exitcode).name})"
        except ValueError:
            return ""
    return ""


def _ipc_dir(port_args: PortArgs) -> Optional[str]:
    path = port_args.tokenizer_ipc_name
    if path.startswith("ipc://"):
        return os.path.dirname(path[len("ipc://") :])
    return None


# ---------------------------------------------------------------------------- launch
_EARLY_EXIT_HINT = (
    ' (see its log above; a script that creates an Engine must guard it with `if __name__ == "__main__":`'
    " because child processes are spawned)"
)


def _reported_error(reader: Any) -> Optional[str]:
    """The error text a scheduler rank sent before it died, if it sent one."""
    try:
        if reader.poll(0):
            msg = reader.recv()
            if isinstance(msg, dict) and msg.get("status") == "error":
                return str(msg.get("error"))
    except (EOFError, OSError):
        pass
    return None


def _death_error(children: ChildProcesses, readers: dict[str, Any], waiting_for: str) -> RuntimeError:
    """The error to raise when a child died during start-up: the dead rank's own report (the
    ranks of one engine often fail on the same check, and whichever exits first is a race)."""
    dead = children.dead()
    for dead_name, _proc in dead:
        reader = readers.get(dead_name)
        error = _reported_error(reader) if reader is not None else None
        if error is not None:
            return RuntimeError(f"{dead_name} failed to start:\n{error}")
    dead_name, dead_proc = dead[0]
    return RuntimeError(
        f"{dead_name} process exited with code {dead_proc.exitcode} before {waiting_for} was ready{_EARLY_EXIT_HINT}"
    )


def _wait_ready(
    reader: Any, proc: mp.process.BaseProcess, name: str, children: ChildProcesses, readers: dict[str, Any]
) -> SchedulerReadyInfo:
    """The ready message of one scheduler rank; fails fast if any child dies meanwhile."""
    while not reader.poll(READY_POLL_S):
        if reader.poll(0):
            break
        if children.dead():
            raise _death_error(children, readers, name)
    try:
        msg = reader.recv()
    except EOFError:
        proc.join(timeout=1.0)
        raise RuntimeError(
            f"{name} process exited with code {proc.exitcode} before it was ready{_EARLY_EXIT_HINT}"
        ) from None
    if not isinstance(msg, dict) or msg.get("status") != "ready":
        error = msg.get("error") if isinstance(msg, dict) else repr(msg)
        raise RuntimeError(f"{name} failed to start:\n{error}")
    return msg["info"]


def scheduler_ranks(server_args: ServerArgs) -> range:
    """World ranks whose scheduler processes run on this node (one process per rank)."""
    from sglang.srt.distributed.parallel_layout import ParallelLayout

    per_node = ParallelLayout.from_server_args(server_args).world_size // max(server_args.nnodes, 1)
    start = server_args.node_rank * per_node
    return range(start, start + per_node)


def prepare_rank_args(server_args: ServerArgs) -> ServerArgs:
    """Fill in what every rank must agree on before the ranks start: the rendezvous address of
    torch.distributed (a free local port when the world is on this machine alone) and the torch
    threads of each rank (this machine's cores shared by its local ranks)."""
    changes: dict[str, Any] = {}
    local_ranks = len(scheduler_ranks(server_args))
    world = local_ranks * max(server_args.nnodes, 1)
    if world > 1 and not server_args.dist_init_addr:
        from sglang.srt.distributed.init import get_free_port

        changes["dist_init_addr"] = f"127.0.0.1:{get_free_port()}"
    if server_args.num_threads is None:
        changes["num_threads"] = max(1, (os.cpu_count() or 1) // local_ranks)
    return server_args.replace(**changes) if changes else server_args


def launch_processes(
    server_args: ServerArgs,
    port_args: Optional[PortArgs] = None,
    scheduler_entry: Optional[Callable[..., None]] = None,
) -> tuple[ChildProcesses, SchedulerReadyInfo, Optional[Any]]:
    """Start the scheduler rank(s) and the detokenizer; return them, rank 0's info and the tokenizer.

    Raises RuntimeError with the child's error text when a child fails to start (the other
    children are stopped first).
    """
    for note in server_args.compat_notes():  # upstream flags accepted here: say what they do
        logger.info("%s", note)
    port_args = port_args or PortArgs.init_new(server_args)
    server_args = prepare_rank_args(server_args)
    is_head_node = server_args.node_rank == 0
    ctx = child_context(server_args.device)
    env, launcher = dict(os.environ), os.getpid()
    children = ChildProcesses(port_args)
    readers = []
    try:
        for rank in scheduler_ranks(server_args):
            reader, writer = ctx.Pipe(duplex=False)
            proc = ctx.Process(
                target=_scheduler_entry,
                args=(server_args, port_args, rank, writer, scheduler_entry, env, launcher),
                name=f"sglang-scheduler-{rank}",
                daemon=False,
            )
            proc.start()
            writer.close()  # so that recv() sees EOF if the child dies
            children.add(f"Scheduler rank {rank}", proc)
            readers.append((reader, proc, f"Scheduler rank {rank}"))
        tokenizer = None
        if is_head_node and not server_args.skip_tokenizer_init:
            from sglang.srt.utils.hf_transformers_utils import get_tokenizer

            tokenizer = get_tokenizer(server_args.tokenizer_path, server_args.trust_remote_code)
        if is_head_node:  # other nodes run only their scheduler ranks
            detok = detokenizer_context().Process(  # decodes with the launcher's tokenizer, shipped
                target=_detokenizer_entry,
                args=(server_args, port_args, detok_tokenizer_spec(tokenizer), env, launcher),
                name="sglang-detokenizer",
                daemon=False,
            )
            detok.start()
            children.add("Detokenizer", detok)
            if server_args.enable_dp_attention and server_args.dp_size > 1:
                ctrl = ctx.Process(
                    target=_dp_controller_entry,
                    args=(server_args, port_args, env, launcher),
                    name="sglang-dp-controller",
                    daemon=False,
                )
                ctrl.start()
                children.add("DP controller", ctrl)

        by_name = {name: reader for reader, _, name in readers}
        infos = [_wait_ready(reader, proc, name, children, by_name) for reader, proc, name in readers]
        if children.dead():
            raise _death_error(children, by_name, "the engine")
    except BaseException:
        children.terminate(grace_s=2.0)
        raise
    finally:
        for reader, _, _ in readers:
            reader.close()
    return children, infos[0], tokenizer


def run_worker_node(server_args: ServerArgs) -> None:
    """`launch_server` on a node other than 0: run this node's scheduler ranks and wait.

    The node serves no HTTP; its ranks take part in the collectives of the head node's ranks.
    Exits non-zero as soon as one of its ranks dies (the ranks of the other nodes then fail in
    their next collective and their servers exit too).
    """
    children, _info, _ = launch_processes(server_args)
    ranks = list(scheduler_ranks(server_args))
    logger.info("node %d: scheduler ranks %s ready; serving through node 0", server_args.node_rank, ranks)
    stop = threading.Event()

    def on_death(message: str) -> None:
        if stop.is_set():
            return
        logger.error("%s: shutting this node down", message)
        children.terminate(grace_s=2.0)
        os._exit(1)

    def on_signal(_sig: int, _frame: Any) -> None:
        stop.set()

    children.start_watchdog(on_death)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        while not stop.wait(1.0):
            pass
    finally:
        children.terminate()
