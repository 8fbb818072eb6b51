"""Shard Linear (Sharded CP, seed 000 §3.2; vllm-ascend's "layer_sharding"): under context parallelism a
series of same-shaped linear layers, one per decoder layer, is stored ONCE across the cp group:
layer i's weights live only on cp rank `i % cp` (their owner); the other ranks drop them after
loading. Before a layer runs its weights are broadcast from the owner into a reusable window buffer;
the broadcast of the NEXT layer (in execution order, wrapping to the stage's first layer for the
next forward) is started as the current layer begins, so it overlaps the current layer's compute;
after the layer, the window is handed back. Outputs are bit-identical to unsharded weights (a
broadcast copies the bits; every rank runs the plain `F.linear`, no prepacked copy).

Weight memory per rank for the series: the layers it owns (ceil(L / cp)) plus at most two windows
(one when cp = 2: of two consecutive layers at most one is someone else's), instead of L.
Used by DeepSeek MLA for q_b_proj and o_proj (`--enable-shard-linear`); needs attn_tp = 1 (the cp
ranks must hold the same weights to share them).

Every cp rank must call `acquire` / `release` for the same layers in the same order (they do: cp
ranks run every layer of every batch), since each acquire issues collectives on the cp group.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

import torch
import torch.distributed as dist

if TYPE_CHECKING:
    from sglang.srt.distributed.group_coordinator import GroupCoordinator


class ShardLinearSeries:
    """The sharded weights of `layers`: [(layer_id, {name: linear module})] in execution order."""

    def __init__(self, group: "GroupCoordinator", layers: list[tuple[int, dict[str, Any]]]):
        if not layers:
            raise ValueError("Shard Linear needs at least one layer")
        self.group = group
        self.size, self.rank = group.size, group.rank
        self.order = [lid for lid, _ in layers]
        self.modules = dict(layers)
        first = layers[0][1]
        self.names = list(first)
        self.specs = {
            n: (tuple(first[n].weight.shape), first[n].weight.dtype, first[n].weight.device)
            for n in self.names
        }
        for lid, mods in layers:
            for n in self.names:
                w = mods[n].weight
                if (tuple(w.shape), w.dtype, w.device) != self.specs[n]:
                    raise ValueError(
                        f"Shard Linear: {n} of layer {lid} differs in shape / dtype from layer "
                        f"{self.order[0]}"
                    )
        self._held: dict[int, tuple[dict[str, torch.Tensor], list[Any], bool]] = {}
        self._free: list[dict[str, torch.Tensor]] = []
        self.windows_allocated = 0
        self.broadcasts = 0
        self._empty = {n: torch.empty(0, dtype=self.specs[n][1], device=self.specs[n][2]) for n in self.names}
        self.active = False

    def owner(self, layer_id: int) -> int:
        return layer_id % self.size

    def activate(self) -> None:
        """Drop the weights this rank does not own (call after loading); every rank then runs the
        plain linear (a prepacked copy would differ in bits between the owner and the others)."""
        for lid, mods in self.modules.items():
            for n, m in mods.items():
                m.packed_weight = None
                if self.owner(lid) != self.rank:
                    m.weight.data = self._empty[n]
        self.active = self.size > 1

    def weight_bytes(self) -> int:
        """Bytes this rank holds for the series: owned weights plus the windows allocated so far."""
        specs = self.specs.values()
        per_layer = sum(torch.Size(s).numel() * torch.empty(0, dtype=d).element_size() for s, d, _ in specs)
        owned = sum(1 for lid in self.order if self.owner(lid) == self.rank)
        return (owned + self.windows_allocated) * per_layer

    def _window(self) -> dict[str, torch.Tensor]:
        if self._free:
            return self._free.pop()
        self.windows_allocated += 1
        return {n: torch.empty(s, dtype=d, device=dev) for n, (s, d, dev) in self.specs.items()}

    def _fetch(self, layer_id: int) -> None:
        if layer_id in self._held:
            return
        src = self.owner(layer_id)
        mine = src == self.rank
        bufs = {n: m.weight.data for n, m in self.modules[layer_id].items()} if mine else self._window()
        world_src = self.group.ranks[src]
        group = self.group.device_group
        works = [dist.broadcast(bufs[n], src=world_src, group=group, async_op=True) for n in self.names]
        self.broadcasts += 1
        self._held[layer_id] = (bufs, works, not mine)

    def _next(self, layer_id: int) -> int:
        i = self.order.index(layer_id)
        return self.order[(i + 1) % len(self.order)]

    def acquire(self, layer_id: int) -> None:
        """Make `layer_id`'s weights usable on this rank; start fetching the next layer's."""
        if not self.active:
            return
        self._fetch(layer_id)
        nxt = self._next(layer_id)
        if nxt != layer_id:
            self._fetch(nxt)  # overlaps this layer's compute
        bufs, works, window = self._held[layer_id]
        for w in works:
            w.wait()
        if window:
            for n, m in self.modules[layer_id].items():
                m.weight.data = bufs[n]

    def release(self, layer_id: int) -> None:
        """The layer is done with its weights: a borrowed window goes back to the pool."""
        if not self.active:
            return
        held: Optional[tuple] = self._held.pop(layer_id, None)
        if held is None:
            return
        bufs, _, window = held
        if window:
            for n, m in self.modules[layer_id].items():
                m.weight.data = self._empty[n]
            self._free.append(bufs)
