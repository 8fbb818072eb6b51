"""The Mooncake transfer backend: KV bytes through the Mooncake transfer engine (data_plane.py),
control messages over ZMQ (messages.py), one transfer manager per rank (transport.py: the shared
part; prefill_conn.py: `MooncakeKVSender` and its manager; decode_conn.py: `MooncakeKVReceiver`
and its manager), built by `MooncakeBackend` (backend.py).

Each manager owns one PULL socket read by one receiver thread; the prefill manager also owns the
transfer threads (a room always goes to the same thread, so its chunks and its final report stay
in order). The scheduler thread only calls `send` / `finish` / `abort` and reads `poll()`;
threads advance the `TransferState`.

Protocol (one request, "room"):
 1. decode rank: look the prefill ranks up at the bootstrap server, pre-allocate KV, send
    `DecodeKVRequest` (slots + buffer addresses) to every prefill rank;
 2. prefill rank: WaitingForInput once every decode rank's request is in; after each chunk's
    forward, write that chunk's page runs into the decode ranks' slots; after the last chunk and
    the first token, report `TransferDone` (the entry rank adds the first token);
 3. decode rank: Success once every prefill rank reported; it answers `TransferComplete(ok)` and
    the prefill ranks may free their KV (Success there).
With decode pipeline stages, step 1 is stage 0's: it first sends `StageKVRequest` to the same tp
rank of each later stage, which mirrors the row and sends its own `DecodeKVRequest` (reports to
stage 0); a prefill rank waits for tp × pp decode requests, and stage 0 needs every (prefill rank,
decode stage) `TransferDone` before Success.
Failures: any side fails the room and tells the other (`TransferDone(ok=False)` /
`TransferComplete(ok=False)`). A prefill rank acknowledges a decode-side failure only after its
last write of that room, so the decode side frees its slots only when nothing can still land in
them (`MooncakeKVReceiver.drained`); a dead prefill server (heartbeat) counts as drained.
"""
