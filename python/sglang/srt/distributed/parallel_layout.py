"""Rank <-> coordinate maths of the parallel layout. Pure Python: no torch.distributed.

World = pp stages × tp ranks per stage, `world_rank = pp_rank · tp + tp_rank`.
A stage's tp ranks have two views of the same ranks:
- attention: (attn_dp, attn_cp, attn_tp), attn_tp fastest, `attn_tp = tp / (attn_dp · attn_cp)`;
- MoE: (moe_ep, moe_tp), moe_tp fastest, `moe_tp = tp / moe_ep`.
An *axis group* is the set of world ranks that differ only in that axis' coordinate; it is ordered
by that coordinate (which is also ascending world-rank order).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

AXES: tuple[str, ...] = ("tp", "pp", "attn_dp", "attn_cp", "attn_tp", "moe_ep", "moe_tp")


@dataclass(frozen=True)
class RankCoords:
    """Every coordinate of one world rank."""

    world_rank: int
    pp: int
    tp: int
    attn_dp: int
    attn_cp: int
    attn_tp: int
    moe_ep: int
    moe_tp: int

    def axis(self, axis: str) -> int:
        """The coordinate along `axis` (one of AXES)."""
        _check_axis(axis)
        return getattr(self, axis)


def _check_axis(axis: str) -> None:
    if axis not in AXES:
        raise ValueError(f"unknown parallel axis {axis!r}; expected one of {list(AXES)}")


def resolve_tp_size(tp_size_given: Optional[int], dp: int, cp: int) -> int:
    """The tp size to use: the given one, or `dp · cp` when none was given (`--cp-size N` alone)."""
    return dp * cp if tp_size_given is None else int(tp_size_given)


@dataclass(frozen=True)
class ParallelLayout:
    """Sizes of every parallel axis and the maths between world ranks and coordinates."""

    pp: int = 1
    tp: int = 1
    attn_dp: int = 1
    attn_cp: int = 1
    moe_ep: int = 1
    # DP attention's sharding choices (docs/dp_attention.md): dense MLPs over the whole tp group
    # (None) or replicated on every rank (1, `--moe-dense-tp-size 1`); the LM head over the whole
    # tp group (False) or inside the attention-TP group (`--enable-dp-lm-head`).
    moe_dense_tp: Optional[int] = None
    dp_lm_head: bool = False
    # MoE tokens reach their experts by an all-to-all over moe_ep (`--moe-a2a-backend all_to_all`)
    # instead of every rank of the tp group seeing every token
    moe_a2a: bool = False
    # embedding / LM head vocab-sharded over the cp group (`--enable-cp-dense-tp`; layers/cp_dense_tp.py)
    cp_dense_tp: bool = False

    # ------------------------------------------------------------------ sizes
    @property
    def world_size(self) -> int:
        return self.pp * self.tp

    @property
    def attn_tp(self) -> int:
        return self.tp // (self.attn_dp * self.attn_cp)

    @property
    def moe_tp(self) -> int:
        return self.tp // self.moe_ep

    def size(self, axis: str) -> int:
        """Number of ranks in one group of `axis`."""
        _check_axis(axis)
        return getattr(self, axis)

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_server_args(cls, server_args: Any) -> "ParallelLayout":
        """Layout of one engine (one DP replica unless DP attention is on), validated.

        `dp_size` counts as attention DP only with `enable_dp_attention`. ServerArgs' `tp_size`
        defaults to 1, so `tp_size == 1` together with `cp_size > 1` is read as "not given" and
        becomes `dp · cp` (see `resolve_tp_size`).
        """
        dp = (
            int(getattr(server_args, "dp_size", 1) or 1)
            if getattr(server_args, "enable_dp_attention", False)
            else 1
        )
        cp = int(getattr(server_args, "cp_size", 1) or 1)
        tp_given: Optional[int] = getattr(server_args, "tp_size", None)
        if tp_given == 1 and cp > 1:
            tp_given = None
        layout = cls(
            pp=int(getattr(server_args, "pp_size", 1) or 1),
            tp=resolve_tp_size(tp_given, dp, cp),
            attn_dp=dp,
            attn_cp=cp,
            moe_ep=int(getattr(server_args, "ep_size", 1) or 1),
            moe_dense_tp=getattr(server_args, "moe_dense_tp_size", None),
            dp_lm_head=bool(getattr(server_args, "enable_dp_lm_head", False)),
            moe_a2a=getattr(server_args, "moe_a2a_backend", "none") == "all_to_all",
            cp_dense_tp=bool(getattr(server_args, "enable_cp_dense_tp", False)),
        )
        layout.validate()
        return layout

    def validate(self) -> None:
        """Raise ValueError with one readable sentence when the sizes do not fit together."""
        for field, flag in (
            ("pp", "pp_size"),
            ("tp", "tp_size"),
            ("attn_dp", "dp_size"),
            ("attn_cp", "cp_size"),
            ("moe_ep", "ep_size"),
        ):
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{flag} must be a positive integer, got {value!r}")
        dp_cp = self.attn_dp * self.attn_cp
        if self.tp % dp_cp:
            raise ValueError(
                f"tp_size ({self.tp}) must be divisible by dp_size × cp_size "
                f"({self.attn_dp} × {self.attn_cp} = {dp_cp})"
            )
        if self.tp % self.moe_ep:
            raise ValueError(f"tp_size ({self.tp}) must be divisible by ep_size ({self.moe_ep})")
        if self.moe_dense_tp not in (None, 1):
            raise ValueError(f"moe_dense_tp_size must be unset or 1, got {self.moe_dense_tp!r}")
        if self.moe_a2a and self.moe_ep != self.tp:
            raise ValueError(
                f"the all-to-all MoE dispatch needs ep_size == tp_size (whole experts per rank), "
                f"got ep {self.moe_ep}, tp {self.tp}"
            )
        if self.cp_dense_tp and (self.attn_cp == 1 or self.attn_tp != 1 or self.attn_dp != 1):
            raise ValueError(
                f"--enable-cp-dense-tp shards the embedding / LM head over the cp group: needs --cp-size > 1, "
                f"--tp-size == --cp-size and no DP attention, got cp {self.attn_cp}, tp {self.tp}, dp {self.attn_dp}"
            )

    # ------------------------------------------------------------------ rank <-> coordinates
    def _check_rank(self, world_rank: int) -> None:
        self.validate()
        if not 0 <= world_rank < self.world_size:
            raise ValueError(f"world rank {world_rank} out of range [0, {self.world_size})")

    def world_rank_of(self, pp_rank: int, tp_rank: int) -> int:
        if not (0 <= pp_rank < self.pp and 0 <= tp_rank < self.tp):
            raise ValueError(f"(pp_rank {pp_rank}, tp_rank {tp_rank}) out of range ({self.pp}, {self.tp})")
        return pp_rank * self.tp + tp_rank

    def tp_rank_of_attn(self, attn_dp_rank: int, attn_cp_rank: int, attn_tp_rank: int) -> int:
        """tp rank inside a stage of the attention coordinates (attn_tp fastest)."""
        return (attn_dp_rank * self.attn_cp + attn_cp_rank) * self.attn_tp + attn_tp_rank

    def tp_rank_of_moe(self, moe_ep_rank: int, moe_tp_rank: int) -> int:
        """tp rank inside a stage of the MoE coordinates (moe_tp fastest)."""
        return moe_ep_rank * self.moe_tp + moe_tp_rank

    def coords(self, world_rank: int) -> RankCoords:
        self._check_rank(world_rank)
        pp_rank, tp_rank = divmod(world_rank, self.tp)
        dp_cp, attn_tp_rank = divmod(tp_rank, self.attn_tp)
        attn_dp_rank, attn_cp_rank = divmod(dp_cp, self.attn_cp)
        moe_ep_rank, moe_tp_rank = divmod(tp_rank, self.moe_tp)
        return RankCoords(
            world_rank=world_rank,
            pp=pp_rank,
            tp=tp_rank,
            attn_dp=attn_dp_rank,
            attn_cp=attn_cp_rank,
            attn_tp=attn_tp_rank,
            moe_ep=moe_ep_rank,
            moe_tp=moe_tp_rank,
        )

    def _with(self, c: RankCoords, axis: str, value: int) -> int:
        """World rank of `c` with its `axis` coordinate replaced by `value`."""
        pp, tp = c.pp, c.tp
        if axis == "pp":
            pp = value
        elif axis == "tp":
            tp = value
        elif axis in ("attn_dp", "attn_cp", "attn_tp"):
            attn = {"attn_dp": c.attn_dp, "attn_cp": c.attn_cp, "attn_tp": c.attn_tp, axis: value}
            tp = self.tp_rank_of_attn(attn["attn_dp"], attn["attn_cp"], attn["attn_tp"])
        else:
            moe = {"moe_ep": c.moe_ep, "moe_tp": c.moe_tp, axis: value}
            tp = self.tp_rank_of_moe(moe["moe_ep"], moe["moe_tp"])
        return self.world_rank_of(pp, tp)

    def ranks_of(self, axis: str, world_rank: int) -> list[int]:
        """World ranks of the `axis` group containing `world_rank`, ordered by the axis coordinate."""
        _check_axis(axis)
        c = self.coords(world_rank)
        return [self._with(c, axis, i) for i in range(self.size(axis))]

    def axis_rank(self, axis: str, world_rank: int) -> int:
        """Index of `world_rank` inside its `axis` group."""
        return self.coords(world_rank).axis(axis)

    def all_groups(self, axis: str) -> list[list[int]]:
        """Every group of `axis` (they partition the world), in order of their smallest rank."""
        _check_axis(axis)
        groups: list[list[int]] = []
        seen: set[int] = set()
        for r in range(self.world_size):
            if r not in seen:
                group = self.ranks_of(axis, r)
                seen.update(group)
                groups.append(group)
        return groups

    def replica_ranks(self, world_rank: int) -> list[int]:
        """World ranks of the attention-DP replica of `world_rank`: the attn_cp × attn_tp ranks of its
        stage that share its attn_dp coordinate (the whole stage when attn_dp = 1), in tp order."""
        c = self.coords(world_rank)
        per = self.attn_cp * self.attn_tp
        first = c.attn_dp * per
        return [self.world_rank_of(c.pp, first + i) for i in range(per)]

    def all_replica_groups(self) -> list[list[int]]:
        """Every attention-DP replica of every stage, in order of their smallest rank."""
        return [
            self.replica_ranks(self.world_rank_of(pp, d * self.attn_cp * self.attn_tp))
            for pp in range(self.pp)
            for d in range(self.attn_dp)
        ]

    def pp_neighbors(self, world_rank: int) -> tuple[int, int]:
        """(previous, next) stage's world rank with the same tp rank, wrapping round the ring
        (the last stage's next is stage 0, whose previous is the last; with pp = 1 both are self)."""
        c = self.coords(world_rank)
        prev = self.world_rank_of((c.pp - 1) % self.pp, c.tp)
        nxt = self.world_rank_of((c.pp + 1) % self.pp, c.tp)
        return prev, nxt

    def is_entry_rank(self, world_rank: int) -> bool:
        """pp stage 0, tp rank 0: the rank that talks to the tokenizer."""
        c = self.coords(world_rank)
        return c.pp == 0 and c.tp == 0

    def is_replica_entry(self, world_rank: int) -> bool:
        """pp stage 0, first rank of its attention-DP replica (attn_cp 0, attn_tp 0): the rank that
        takes its replica's requests (the entry rank when attn_dp = 1)."""
        c = self.coords(world_rank)
        return c.pp == 0 and c.attn_cp == 0 and c.attn_tp == 0

    def describe(self) -> str:
        return (
            f"world {self.world_size} = pp {self.pp} × tp {self.tp}; attention dp {self.attn_dp} × cp {self.attn_cp}"
            f" × tp {self.attn_tp}; moe ep {self.moe_ep} × tp {self.moe_tp}"
        )
