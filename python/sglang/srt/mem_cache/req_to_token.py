"""ReqToTokenPool: one row per running request mapping token position -> KV slot index."""

from __future__ import annotations

from typing import Optional, Union

import torch


class ReqToTokenPool:
    """A fixed table `req_to_token[row, pos] = kv_slot` plus a free list of rows.

    A request holds one row for its lifetime; the row's first `seq_len` entries are the KV slots of
    its tokens. Rows are handed out lowest-index first after a `clear()`.
    """

    def __init__(self, size: int, max_context_len: int, device: Union[str, torch.device] = "cpu"):
        if size < 1 or max_context_len < 1:
            raise ValueError(f"size and max_context_len must be >= 1, got {size}, {max_context_len}")
        self.size = size
        self.max_context_len = max_context_len
        self.device = torch.device(device)
        self.req_to_token = torch.zeros((size, max_context_len), dtype=torch.int64, device=self.device)
        self._free_slots: list[int] = []
        self._in_use: list[bool] = []
        self.clear()

    def available_size(self) -> int:
        return len(self._free_slots)

    def alloc(self, n: int = 1) -> Optional[list[int]]:
        """Take `n` free rows, or return None (taking nothing) if fewer are free."""
        if n < 0:
            raise ValueError(f"cannot allocate {n} rows")
        if n > len(self._free_slots):
            return None
        rows = self._free_slots[:n]
        self._free_slots = self._free_slots[n:]
        for r in rows:
            self._in_use[r] = True
        return rows

    def free(self, index: Union[int, list[int]]) -> None:
        """Return rows to the free list; freeing a row that is not in use raises."""
        rows = [index] if isinstance(index, int) else [int(i) for i in index]
        for r in rows:
            if not 0 <= r < self.size:
                raise ValueError(f"req pool index {r} out of range [0, {self.size})")
        if len(set(rows)) != len(rows):
            raise RuntimeError(f"double free in ReqToTokenPool: duplicate rows in {rows}")
        for r in rows:
            if not self._in_use[r]:
                raise RuntimeError(f"double free in ReqToTokenPool: row {r} is not in use")
        for r in rows:
            self._in_use[r] = False
        self._free_slots.extend(rows)

    def clear(self) -> None:
        """Mark every row free (table contents are left as garbage)."""
        self._free_slots = list(range(self.size))
        self._in_use = [False] * self.size
