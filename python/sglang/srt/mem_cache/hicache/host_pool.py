"""The L2 host tier: a page pool holding every layer's KV rows of the tokens it keeps.

`kv_token_buffers(pool)` lists a device KV pool's per-token buffers (each `[rows, ...]`, indexed
by slot): K and V of every layer for MHA, the `[latent ; k_rope]` rows (and DSA's indexer keys,
with their int8 copy when kept) for MLA. `TokenLayout` packs / unpacks those rows of some slots to
bytes (storage pages). The host pool mirrors the buffers with its own rows (the platform's host
memory: lazily committed on CPU, pinned on accelerators) and its own `TokenToKVPoolAllocator`
(own budget, page 0 padding as on the device). Backups are `copy_rows` on the calling thread;
restores go through the rank's loader, layer by layer beside the
forward (layer_load.py: a thread on CPU, copy-stream events on accelerators). Under context
parallelism (`CPShard`) the slots are the scheduler's virtual ones and a rank copies, packs and
unpacks only its own rows.
"""

from __future__ import annotations

import warnings
from typing import Callable, Optional

import torch

from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
from sglang.srt.mem_cache.cp_slots import CPSlotMapping
from sglang.srt.mem_cache.hicache.layer_load import Loader
from sglang.srt.mem_cache.transfer_layout import slot_runs

MIN_RUN = 64  # rows per run, on average, from which slice copies beat an index copy (a call each)


def kv_token_buffers(pool) -> list[torch.Tensor]:
    """The per-token buffers of a KV pool ([rows, ...] each, slot-indexed), in a fixed order."""
    if hasattr(pool, "k_buffer"):
        return [*pool.k_buffer, *pool.v_buffer]
    buffers = list(pool.kv_buffer)
    # DSA: the indexer's keys, and their int8 copy and its scales when the indexer scores in int8
    for name in ("index_k_buffer", "index_k_int8", "index_k_scale"):
        buffers += list(getattr(pool, name, []))
    return buffers


class TokenLayout:
    """Shapes and dtypes of one token's rows across a list of buffers."""

    def __init__(self, buffers: list[torch.Tensor]):
        self.specs = [(tuple(b.shape[1:]), b.dtype) for b in buffers]
        self.row_bytes = [
            int(torch.Size(s).numel()) * torch.empty((), dtype=d).element_size() for s, d in self.specs
        ]

    def token_bytes(self) -> int:
        return sum(self.row_bytes)

    def describe(self) -> str:
        return ";".join(f"{list(s)}:{str(d).replace('torch.', '')}" for s, d in self.specs)

    def pack(self, buffers: list[torch.Tensor], slots: torch.Tensor) -> bytes:
        """The rows of `slots`, buffer after buffer, as bytes (copied once into one tensor)."""
        n = slots.numel()
        out = torch.empty(n * self.token_bytes(), dtype=torch.uint8)
        copy_rows(buffers, slots, self._views(out, n), torch.arange(n))
        return out.numpy().tobytes()

    def _views(self, flat: torch.Tensor, n: int) -> list[torch.Tensor]:
        """`flat` (bytes of `n` tokens, buffer after buffer) as each buffer's [n, ...] rows."""
        out, offset = [], 0
        for (shape, dtype), rb in zip(self.specs, self.row_bytes):
            out.append(flat[offset : offset + n * rb].view(dtype).reshape(n, *shape))
            offset += n * rb
        return out

    def unpack_into(
        self, buffers: list[torch.Tensor], slots: torch.Tensor, data: bytes, skip: int = 0
    ) -> None:
        """Write the rows packed in `data`, but the first `skip`, to `slots`."""
        n = slots.numel() + skip
        if len(data) != n * self.token_bytes():
            raise ValueError(f"page holds {len(data)} bytes, expected {n * self.token_bytes()}")
        with warnings.catch_warnings():  # a read-only buffer: only read here
            warnings.simplefilter("ignore", UserWarning)
            flat = torch.frombuffer(data, dtype=torch.uint8)
        copy_rows(self._views(flat, n), torch.arange(skip, n), buffers, slots)


def _bytes(t: torch.Tensor) -> torch.Tensor:
    """One-byte float tensors (FP8 caches) as uint8: CPU `index_copy_` has no FP8 kernel."""
    return t.view(torch.uint8) if t.is_floating_point() and t.element_size() == 1 else t


def copy_rows(
    src: list[torch.Tensor],
    src_slots: torch.Tensor,
    dst: list[torch.Tensor],
    dst_slots: torch.Tensor,
    non_blocking: bool = False,
) -> None:
    """Rows `src_slots` of each buffer of `src` -> rows `dst_slots` of the matching `dst` buffer.
    Rows that lie in runs (consecutive slots on both sides, `MIN_RUN` rows or more on average:
    fresh allocations, whole pages) are copied a run at a time, slice to slice (one pass, ~2.5x an
    index copy on the MHA pool's head-major buffers); scattered rows by index (gather, scatter).
    (index_select / index_copy_, not b[slots]: on the MHA pool's transposed [rows, H, D] views an
    index expression walks the whole layer buffer, kv_pool.set_kv_buffer.) `non_blocking`: the
    copies are queued on the current stream (an accelerator's, from pinned host memory)."""
    runs = slot_runs(src_slots.cpu().numpy(), dst_slots.cpu().numpy())
    if len(runs) * MIN_RUN <= src_slots.numel():
        spans = runs.tolist()
        for s, d in zip(src, dst):
            s, d = (_bytes(s), _bytes(d)) if s.dtype == d.dtype else (s, d)
            for a, b, n in spans:
                d[b : b + n].copy_(s[a : a + n], non_blocking=non_blocking)
        return
    for s, d in zip(src, dst):
        src_idx = src_slots.to(device=s.device, dtype=torch.int64)
        if s.dtype == d.dtype:
            rows = _bytes(s).index_select(0, src_idx).to(d.device, non_blocking=non_blocking)
        else:  # tiers of different dtypes: the rows cast on the way
            rows = _bytes(
                s.index_select(0, src_idx).to(device=d.device, dtype=d.dtype, non_blocking=non_blocking)
            )
        _bytes(d).index_copy_(0, dst_slots.to(device=d.device, dtype=torch.int64), rows)


class CPShard:
    """Context parallelism: which rows of a virtual slot space this rank stores
    (`cp_slots.CPSlotMapping`; the tree and both allocators work in virtual slots)."""

    def __init__(self, mapping: CPSlotMapping, rank: int):
        self.mapping, self.rank = mapping, rank

    def local(self, *slot_lists: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The physical slots of the rows this rank owns, for lists of virtual slots laid out alike
        (the same offsets in their virtual pages: a row's owner is the same in every list)."""
        mine = self.mapping.owner(slot_lists[0]) == self.rank
        return tuple(self.mapping.local_slot(s[mine]) for s in slot_lists)

    def owned_before(self, n: int) -> int:
        """Rows this rank owns among the first `n` positions of a virtual page."""
        return int((self.mapping.position_owner(torch.arange(n)) == self.rank).sum())


class HostKVPool:
    """L2: rows for `size` tokens mirroring `device_buffers`, in pages of `page_size`. With `shard`
    (context parallelism) slots are virtual and this rank holds its share of each page's rows."""

    def __init__(
        self,
        device_buffers: list[torch.Tensor],
        size: int,
        page_size: int,
        shard: Optional[CPShard] = None,
        loader: Optional[Loader] = None,
        zeros: Optional[Callable[[tuple[int, ...], torch.dtype], torch.Tensor]] = None,
    ):
        self.device_buffers = device_buffers
        self.loader = loader  # restores layer by layer beside the forward (layer_load.py), or None
        self.allocator = TokenToKVPoolAllocator(size, page_size)
        self.size = self.allocator.size
        self.page_size = page_size
        self.shard = shard
        cp = 1 if shard is None else shard.mapping.cp_size
        rows = (self.size + page_size) // cp
        # `zeros`: the platform's host memory (CPU: committed as it fills; accelerators: pinned)
        zeros = zeros or (lambda shape, dtype: torch.zeros(shape, dtype=dtype))
        self.buffers = [zeros((rows, *b.shape[1:]), b.dtype) for b in device_buffers]
        self.layout = TokenLayout(device_buffers)

    def available_size(self) -> int:
        return self.allocator.available_size()

    def alloc(self, n: int) -> Optional[torch.Tensor]:
        return self.allocator.alloc(n)

    def free(self, host_slots: torch.Tensor) -> None:
        self.synchronize()  # no load reads the rows any more
        self.allocator.free(host_slots)

    def clear(self) -> None:
        self.synchronize()
        self.allocator.clear()

    def synchronize(self) -> None:
        """Wait for the background restores submitted so far (none without a `loader`)."""
        if self.loader is not None:
            self.loader.synchronize()

    def close(self) -> None:
        """Stop the loader's thread (its restores done first)."""
        if self.loader is not None:
            self.loader.close()

    def _local(self, *slot_lists: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return slot_lists if self.shard is None else self.shard.local(*slot_lists)

    def backup(self, device_slots: torch.Tensor, host_slots: torch.Tensor) -> None:
        """Copy device rows -> host rows (L1 -> L2)."""
        self.synchronize()
        dev, host = self._local(device_slots, host_slots)
        copy_rows(self.device_buffers, dev, self.buffers, host)

    def restore(self, host_slots: torch.Tensor, device_slots: torch.Tensor) -> None:
        """Copy host rows -> device rows (L2 -> L1); with a `loader` layer by layer in the
        background (the KV pool's accessors wait for their layer)."""
        host, dev = self._local(host_slots, device_slots)
        if self.loader is not None:
            self.loader.submit(self.buffers, host, self.device_buffers, dev)
            return
        copy_rows(self.buffers, host, self.device_buffers, dev)

    def pack(self, device_slots: torch.Tensor) -> bytes:
        """A storage page's payload: this rank's rows of `device_slots` (page-aligned)."""
        self.synchronize()
        return self.layout.pack(self.device_buffers, *self._local(device_slots))

    def unpack(self, device_slots: torch.Tensor, data: bytes, skip: int = 0) -> None:
        """Write a page's rows to `device_slots`, but its first `skip` positions (a multiple of
        the page when sharded: `device_slots` start a page)."""
        self.synchronize()
        if self.shard is not None:
            skip = self.shard.owned_before(skip)
        self.layout.unpack_into(self.device_buffers, *self._local(device_slots), data, skip)

    def unpack_host(self, host_slots: torch.Tensor, data: bytes, skip: int = 0) -> None:
        """Write a page's rows, but its first `skip` positions, to host rows (the prefetch thread:
        rows no one else touches until they are handed over; sharded: as `unpack`). A later
        pipeline stage's rows may still be read by a restore stage 0 has long let go of: waited."""
        self.synchronize()
        if self.shard is not None:
            skip = self.shard.owned_before(skip)
        self.layout.unpack_into(self.buffers, *self._local(host_slots), data, skip)

    def page_bytes(self, tokens: int) -> int:
        """Payload bytes of a storage page of `tokens` tokens on this rank."""
        cp = 1 if self.shard is None else self.shard.mapping.cp_size
        return tokens // cp * self.layout.token_bytes()

    def mem_bytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self.buffers)
