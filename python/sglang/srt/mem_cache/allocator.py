"""TokenToKVPoolAllocator: free list of KV-cache slots, optionally in pages.

Slot layout: page p covers slots [p * page_size, (p + 1) * page_size). Page 0 (slot 0 when
page_size == 1) is reserved as a padding slot that is never handed out, so usable pages are
1..num_pages and the KV buffers need `size + page_size` rows.

Tokens of one request fill its pages in order: a token goes into the same page as the previous
token of that request unless that page is full. `alloc_extend` / `alloc_decode` take the slot of
the request's last stored token (`last_locs`) to continue a partly filled page.
"""

from __future__ import annotations

from typing import Optional, Sequence, Union

import torch

IntList = Union[Sequence[int], torch.Tensor]


def _to_list(x: IntList) -> list[int]:
    return x.tolist() if isinstance(x, torch.Tensor) else [int(v) for v in x]


class TokenToKVPoolAllocator:
    """Hands out and takes back KV slots; guards against double free."""

    def __init__(self, size: int, page_size: int = 1, device: Union[str, torch.device] = "cpu"):
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        if size < page_size:
            raise ValueError(f"size ({size}) must be >= page_size ({page_size})")
        self.page_size = page_size
        self.num_pages = size // page_size
        self.size = self.num_pages * page_size
        self.device = torch.device(device)
        self._group: Optional[list[torch.Tensor]] = None
        self.clear()

    # ------------------------------------------------------------------ state
    def clear(self) -> None:
        """Mark every usable page free."""
        self._free_pages = torch.arange(1, self.num_pages + 1, dtype=torch.int64, device=self.device)
        self._released: list[torch.Tensor] = []  # freed pages not yet merged into _free_pages
        self._num_free = self.num_pages
        self._is_free = torch.ones(self.num_pages + 1, dtype=torch.bool, device=self.device)
        self._is_free[0] = False  # padding page, never free and never freeable
        self._group = None

    def available_size(self) -> int:
        """Free tokens (free pages * page_size)."""
        return self._num_free * self.page_size

    def _take_pages(self, n: int) -> torch.Tensor:
        if self._free_pages.numel() < n and self._released:
            merged = torch.cat([self._free_pages, *self._released])
            self._free_pages = torch.sort(merged).values  # prefer low pages for locality
            self._released = []
        pages = self._free_pages[:n]
        self._free_pages = self._free_pages[n:]
        self._is_free[pages] = False
        self._num_free -= n
        return pages

    def _pages_to_slots(self, pages: torch.Tensor) -> torch.Tensor:
        if self.page_size == 1:
            return pages.clone()
        offs = torch.arange(self.page_size, dtype=torch.int64, device=self.device)
        return (pages[:, None] * self.page_size + offs).reshape(-1)

    # ------------------------------------------------------------------ alloc
    def alloc(self, need: int) -> Optional[torch.Tensor]:
        """`need` slots in fresh pages (ceil(need / page_size) whole pages); None if not enough."""
        if need < 0:
            raise ValueError(f"cannot allocate {need} slots")
        num_pages = -(-need // self.page_size)
        if num_pages > self._num_free:
            return None
        return self._pages_to_slots(self._take_pages(num_pages))[:need]

    def alloc_extend(
        self, prefix_lens: IntList, extend_lens: IntList, last_locs: IntList
    ) -> Optional[torch.Tensor]:
        """Slots for positions prefix_len..prefix_len+extend_len-1 of each request, concatenated.

        A request whose prefix ends inside a page continues that page (the one holding
        `last_locs[i]`, the slot of position prefix_len-1) before taking new pages. Returns None,
        allocating nothing, when there are not enough free pages for the whole batch.
        """
        prefix, extend, last = _to_list(prefix_lens), _to_list(extend_lens), _to_list(last_locs)
        if not len(prefix) == len(extend) == len(last):
            raise ValueError("prefix_lens, extend_lens and last_locs must have the same length")
        if any(e < 0 for e in extend) or any(p < 0 for p in prefix):
            raise ValueError("prefix_lens and extend_lens must be >= 0")
        if self.page_size == 1:
            return self.alloc(sum(extend))
        ps = self.page_size
        plans: list[tuple[int, int, int, int]] = []  # (last_loc, in_page, rest, new_pages)
        need_pages = 0
        for pre, ext, loc in zip(prefix, extend, last):
            in_page = 0
            if pre % ps != 0 and ext > 0:
                self._check_last_loc(pre - 1, loc)
                in_page = min(ps - pre % ps, ext)
            rest = ext - in_page
            n_new = -(-rest // ps)
            plans.append((loc, in_page, rest, n_new))
            need_pages += n_new
        if need_pages > self._num_free:
            return None
        new_slots = self._pages_to_slots(self._take_pages(need_pages))
        out: list[torch.Tensor] = []
        cursor = 0
        for loc, in_page, rest, n_new in plans:
            if in_page:
                out.append(torch.arange(loc + 1, loc + 1 + in_page, dtype=torch.int64, device=self.device))
            if rest:
                out.append(new_slots[cursor * ps : cursor * ps + rest])
                cursor += n_new
        if not out:
            return torch.empty(0, dtype=torch.int64, device=self.device)
        return torch.cat(out)

    def alloc_decode(self, seq_lens: IntList, last_locs: IntList) -> Optional[torch.Tensor]:
        """One slot per request for position seq_len-1 (seq_len includes the new token)."""
        seq = torch.as_tensor(_to_list(seq_lens), dtype=torch.int64, device=self.device)
        last = torch.as_tensor(_to_list(last_locs), dtype=torch.int64, device=self.device)
        if seq.shape != last.shape:
            raise ValueError("seq_lens and last_locs must have the same length")
        if seq.numel() and int(seq.min()) < 1:
            raise ValueError("seq_lens must be >= 1 (they include the new token)")
        if self.page_size == 1:
            return self.alloc(seq.numel())
        ps = self.page_size
        pos = seq - 1
        new_page = pos % ps == 0
        cont = ~new_page
        if bool(cont.any()):
            bad = (last[cont] <= 0) | (last[cont] % ps != (pos[cont] - 1) % ps)
            if bool(bad.any()):
                raise ValueError(
                    f"last_locs {last[cont][bad].tolist()} do not match seq_lens {seq[cont][bad].tolist()}"
                )
        n_new = int(new_page.sum())
        if n_new > self._num_free:
            return None
        out = last + 1
        if n_new:
            out[new_page] = self._take_pages(n_new) * ps
        return out

    def _check_last_loc(self, last_pos: int, loc: int) -> None:
        if loc <= 0 or loc % self.page_size != last_pos % self.page_size:
            raise ValueError(
                f"last_loc {loc} is not a valid slot for position {last_pos} with page_size {self.page_size}"
            )

    # ------------------------------------------------------------------ free
    def free(self, indices: torch.Tensor) -> None:
        """Free the pages holding `indices` (each page once); freeing a free page raises."""
        indices = torch.as_tensor(indices, dtype=torch.int64).to(self.device).reshape(-1)
        if indices.numel() == 0:
            return
        if self._group is not None:
            self._group.append(indices)
            return
        pages = torch.unique(indices // self.page_size)
        if self.page_size == 1 and pages.numel() != indices.numel():
            raise RuntimeError("double free: duplicate slots in one free() call")
        if int(pages.min()) < 1 or int(pages.max()) > self.num_pages:
            raise ValueError(f"slots {indices.tolist()} include the padding page or are out of range")
        already = self._is_free[pages]
        if bool(already.any()):
            raise RuntimeError(f"double free of KV pages {pages[already].tolist()}")
        self._is_free[pages] = True
        self._released.append(pages)
        self._num_free += pages.numel()

    def free_group_begin(self) -> None:
        """Collect frees until `free_group_end` (then freed in one call; a page freed twice
        inside one group with page_size > 1 is only freed once, not reported)."""
        self._group = []

    def free_group_end(self) -> None:
        group, self._group = self._group, None
        if group:
            self.free(torch.cat(group))
