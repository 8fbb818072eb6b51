"""GrammarManager: the scheduler's constrained-decoding component (one interface, every server).

The scheduler calls it at fixed points and never asks which backend runs or whether a request is
constrained:

- `refusal(req)`: why a request cannot be served (a grammar with `--grammar-backend none`);
- `route(reqs)`: the requests that may wait to be scheduled now; a constrained request whose grammar
  is not compiled yet is held in the grammar queue while a compile thread works on it;
- `poll(block)`: the held requests whose compile finished (their matcher attached) and those whose
  grammar failed (finished with a 400 naming the error); every rank of the replica agrees on which
  compiles finished (MIN all-reduce), so mirrored schedulers take the same decisions;
- `prepare(req)` / `catch_up(req)`: PD decode: start the compile when the request arrives, then
  attach the matcher and advance it over the tokens the prefill side already sampled;
- `fill_mask(reqs)`: the step's token bitmask for its sampling rows (None: no row constrained);
- `on_token(req, token)`: advance the matcher; the request finishes (`stop`) when the grammar
  terminates, or with an error when the token is not allowed;
- `release(req)` (finished requests), `abort(rid, abort_all)` (held requests);
- `jump_forward(req, context, limit)` / `rollback(req, n)` (`--enable-jump-forward`): the token
  ids that replace the request's last sampled token with it + the text the grammar forces, the
  matcher already moved over them (`jump_forward.py`; the scheduler side is
  `managers/scheduler/jump_forward.py`).

Retraction keeps a request's output (it is re-prefilled, `docs/architecture.md`), so its matcher
stays where it is and the next token is masked exactly as before.

The compile cache is filled only on the scheduler thread (`poll`, `catch_up`), so a thread's timing
never changes what another rank decides.
"""

from __future__ import annotations

import logging
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any, Callable, Optional

import torch

from sglang.srt.constrained.grammar_spec import GrammarError, GrammarSpec, spec_of
from sglang.srt.constrained.jump_forward import retokenize
from sglang.srt.constrained.xgrammar_backend import GrammarState, XGrammarBackend

logger = logging.getLogger(__name__)

POLL_WAIT_S = 0.002  # how long an otherwise idle scheduler waits for a compile per loop


def grammar_error(message: str, status: Optional[int] = 400) -> dict:
    reason = {"type": "abort", "message": message}
    if status is not None:
        reason["status_code"] = status
    return reason


class GrammarManager:
    """`backend_factory`: builds the backend on the first constrained request (its tokenizer tables
    take a moment; servers that never see a grammar never pay it); None with `--grammar-backend
    none`, when `no_backend` says why. `group`: the replica's coordinator (mirrored schedulers agree
    on compile completion through it); None for a single rank. `jump_forward`:
    `--enable-jump-forward` (forced text appended without sampling it)."""

    def __init__(
        self,
        backend_factory: Optional[Callable[[], XGrammarBackend]],
        group: Any = None,
        workers: int = 2,
        no_backend: str = "this server runs --grammar-backend none",
        jump_forward: bool = False,
    ):
        self._factory = backend_factory
        self._backend: Optional[XGrammarBackend] = None
        self.group = group
        self.no_backend = no_backend
        self._pool: Optional[ThreadPoolExecutor] = None
        self._workers = workers
        self._queue: list[tuple[Any, GrammarSpec]] = []  # requests waiting for their compile
        self._futures: dict[GrammarSpec, Future] = {}
        self._states: dict[Any, GrammarState] = {}  # request -> its matcher
        self._failed: list = []  # finished by `route`, reported by the next `poll`
        self.jump_forward_enabled = jump_forward and backend_factory is not None
        self.jump_forward_tokens = 0  # output tokens that jump-forward appended (not sampled)

    @property
    def backend(self) -> XGrammarBackend:
        if self._backend is None:
            self._backend = self._factory()
            self._pool = ThreadPoolExecutor(self._workers, thread_name_prefix="grammar")
        return self._backend

    # ------------------------------------------------------------------ admission
    @property
    def busy(self) -> bool:
        return bool(self._queue or self._failed)

    def refusal(self, req) -> Optional[str]:
        try:
            spec = spec_of(req.sampling_params)
        except GrammarError as e:
            return str(e)
        if spec is not None and self._factory is None:
            return f"{spec.kind} (constrained decoding) needs a grammar backend: {self.no_backend}"
        return None

    def route(self, reqs: list) -> list:
        """The requests of `reqs` that may be scheduled now, in order; the others wait here (or,
        when their output does not fit the grammar, are finished and returned by the next `poll`)."""
        ready = []
        for req in reqs:
            spec = spec_of(req.sampling_params)
            if spec is None or req in self._states:
                ready.append(req)
                continue
            compiled = self.backend.cached(spec)
            if compiled is None:
                self._start(spec)
                self._queue.append((req, spec))
            elif self._attach(req, compiled):
                ready.append(req)
            else:
                self._failed.append(req)
        return ready

    def prepare(self, req) -> None:
        """Start compiling a request's grammar without holding it (PD decode: it waits for its KV)."""
        spec = spec_of(req.sampling_params)
        if spec is not None and self.backend.cached(spec) is None:
            self._start(spec)

    def catch_up(self, req) -> None:
        """Attach the matcher now (waiting for the compile) and advance it over the output so far."""
        spec = spec_of(req.sampling_params)
        if spec is None or req in self._states or req.finished_reason is not None:
            return
        compiled = self.backend.cached(spec)
        if compiled is None:
            self._start(spec)
            compiled = self._result(req, spec, self._futures[spec])
            if spec not in {s for _, s in self._queue}:
                self._futures.pop(spec, None)
        if compiled is not None:
            self._attach(req, compiled)

    def _start(self, spec: GrammarSpec) -> None:
        if spec not in self._futures:
            backend = self.backend
            self._futures[spec] = self._pool.submit(backend.compile, spec)

    def _result(self, req, spec: GrammarSpec, future: Future) -> Optional[Any]:
        try:
            compiled = future.result()
        except GrammarError as e:
            req.finished_reason = grammar_error(str(e))
            return None
        self.backend.store(spec, compiled)
        return compiled

    def _attach(self, req, compiled: Optional[Any]) -> bool:
        """Give `req` its matcher, advanced over its output so far; False when `compiled` is None or
        the output does not fit the grammar (the request is then finished with an error)."""
        if compiled is None:
            return False
        state = self.backend.new_state(compiled)
        for token in req.output_ids:
            if not state.accept(token):
                req.finished_reason = grammar_error(f"output token {token} does not match the grammar", None)
                return False
        self._states[req] = state
        return True

    # ------------------------------------------------------------------ the grammar queue
    def poll(self, block: bool = False) -> tuple[list, list]:
        """(ready, failed) requests of the grammar queue; `block`: wait briefly for a compile first."""
        failed, self._failed = self._failed, []
        if not self._queue:
            return [], failed
        futures = [self._futures[spec] for _, spec in self._queue]
        if block and not any(f.done() for f in futures):
            wait(futures, timeout=POLL_WAIT_S, return_when=FIRST_COMPLETED)
        done = [int(f.done()) for f in futures]
        if self.group is not None and self.group.size > 1:
            t = torch.tensor(done, dtype=torch.int64, device=self.group.device)
            self.group.all_reduce(t, op="min")
            done = [int(v) for v in t.tolist()]
        ready, keep = [], []
        for (req, spec), is_done in zip(self._queue, done):
            if not is_done:
                keep.append((req, spec))
            elif self._attach(req, self._result(req, spec, self._futures[spec])):
                ready.append(req)
            else:
                failed.append(req)
        self._queue = keep
        pending = {spec for _, spec in keep}
        self._futures = {s: f for s, f in self._futures.items() if s in pending or not f.done()}
        return ready, failed

    def abort(self, rid: str, abort_all: bool = False) -> list:
        """Take the matching requests out of the grammar queue (the caller finishes them)."""
        out = [req for req, _ in self._queue if abort_all or req.rid == rid]
        self._queue = [(req, spec) for req, spec in self._queue if req not in out]
        return out

    # ------------------------------------------------------------------ decoding
    def fill_mask(self, reqs: list) -> Optional[torch.Tensor]:
        """[len(reqs), ceil(vocab / 32)] int32 bitmask of the next token of each request (every bit
        set for an unconstrained row); None when no request is constrained."""
        rows = [(i, self._states.get(req)) for i, req in enumerate(reqs)]
        rows = [(i, state) for i, state in rows if state is not None]
        if not rows:
            return None
        bitmask = self.backend.allocate_bitmask(len(reqs))
        for i, state in rows:
            state.fill(bitmask, i)
        return bitmask

    def on_token(self, req, token: int) -> None:
        """Advance `req`'s matcher by its sampled token; finish it when the grammar terminates."""
        state = self._states.get(req)
        if state is None:
            return
        if not state.accept(token):
            req.finished_reason = grammar_error(f"sampled token {token} is not allowed by the grammar", None)
        elif state.terminated:
            req.finished_reason = {"type": "stop", "matched": int(token)}

    def jump_forward(self, req, context: list[int], limit: int) -> Optional[list[int]]:
        """The ids replacing `req`'s last output token (sampled, its KV not written yet) by it +
        the text its grammar forces, at most `limit` + 1 of them, the matcher moved over them;
        None (nothing changed) when the grammar forces nothing or the text does not retokenize.
        `context`: the tokens before the last one (their KV is written: never re-split)."""
        state = self._states.get(req) if self.jump_forward_enabled else None
        if state is None or state.terminated or not req.output_ids:
            return None
        forced = state.forced()
        if not forced:
            return None
        tail = req.output_ids[-1:]
        new = retokenize(self.backend.tokenizer, context, tail, forced)
        if new is None:
            return None
        new = new[: limit + 1]
        if new == tail or not state.replace(tail, new):
            return None
        self.jump_forward_tokens += len(new) - len(tail)
        return new

    def rollback(self, req, n: int) -> None:
        """Undo the matcher's last `n` tokens (jump-forward tokens cut off by a stop condition)."""
        state = self._states.get(req)
        if state is not None:
            state.rollback(n)

    def release(self, req) -> None:
        self._states.pop(req, None)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)

    def internal_state(self) -> dict:
        return {
            "grammar_queue": len(self._queue),
            "grammar_matchers": len(self._states),
            "jump_forward_tokens": self.jump_forward_tokens,
        }
