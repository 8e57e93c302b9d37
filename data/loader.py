"""Batches over token blocks: deterministic, resumable, and split across ranks.

Epoch e visits all train blocks in the order of torch.randperm seeded from (seed, e); a
global batch is the next `batch_size` indices of that order (running on into the next
epoch when one ends), and rank r takes rows r::world_size. So a 1-process run and a
2-process run with the same global batch size see the same global batches.
"""
from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from utils.errors import shown


def _check_split(batch_size: int, rank: int, world_size: int) -> None:
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank={rank} must be in [0, world_size={world_size})")
    if batch_size < 1 or batch_size % world_size:
        raise ValueError(f"batch_size={batch_size} (global sequences per micro-batch) must be a positive multiple of "
                         f"world_size={world_size}: each rank takes batch_size / world_size rows")


def _xy(blocks: Tensor, idx: Tensor) -> tuple[Tensor, Tensor]:
    rows = blocks[idx].long()
    return rows[:, :-1].contiguous(), rows[:, 1:].contiguous()


def epoch_seed(seed: int, epoch: int) -> int:
    """A 63-bit torch seed mixed from (seed, epoch)."""
    state = np.random.SeedSequence([seed % 2**64, epoch]).generate_state(2, dtype=np.uint32)
    return (int(state[0]) << 31) ^ int(state[1])


class BlockLoader:
    """Deterministic shuffled batches over blocks; each rank takes its slice of every global batch."""

    def __init__(self, blocks: Tensor, batch_size: int, seed: int, rank: int = 0, world_size: int = 1):
        _check_split(batch_size, rank, world_size)
        if blocks.ndim != 2 or blocks.shape[0] < 1 or blocks.shape[1] < 2:
            raise ValueError(f"blocks must be [n >= 1, seq_len + 1 >= 2], got {tuple(blocks.shape)}")
        self.blocks, self.batch_size, self.seed = blocks, batch_size, int(seed)
        self.rank, self.world_size = rank, world_size
        self.epoch, self.position = 0, 0
        self._perm: Tensor | None = None
        self._perm_epoch = -1

    def _order(self) -> Tensor:
        if self._perm_epoch != self.epoch:
            g = torch.Generator()
            g.manual_seed(epoch_seed(self.seed, self.epoch))
            self._perm = torch.randperm(self.blocks.shape[0], generator=g)
            self._perm_epoch = self.epoch
        return self._perm

    def next_global_indices(self) -> Tensor:
        """The block indices of the next global batch (advances the loader)."""
        n = self.blocks.shape[0]
        parts, need = [], self.batch_size
        while need:
            take = min(need, n - self.position)
            parts.append(self._order()[self.position:self.position + take])
            self.position += take
            need -= take
            if self.position == n:
                self.epoch, self.position = self.epoch + 1, 0
        return torch.cat(parts)

    def next_batch(self) -> tuple[Tensor, Tensor]:
        """(x, y), int64 [batch_size // world_size, seq_len]: this rank's rows of the next global batch."""
        idx = self.next_global_indices()[self.rank::self.world_size]
        return _xy(self.blocks, idx)

    def state_dict(self) -> dict:
        return {"epoch": int(self.epoch), "position": int(self.position), "seed": int(self.seed),
                "n_blocks": int(self.blocks.shape[0])}

    def load_state_dict(self, d: dict) -> None:
        """Continue from a saved position; TypeError or ValueError (nothing changed) for a state that is not one
        of this loader's: wrong types, out of range, or saved for another number of blocks."""
        if not isinstance(d, dict):
            raise TypeError(f"loader state must be an object, found {shown(d)}")
        missing = [k for k in ("epoch", "position", "seed") if k not in d]
        if missing:
            raise ValueError(f"loader state {shown(d)} lacks {', '.join(missing)}")
        wrong = [k for k in ("epoch", "position", "seed", "n_blocks")
                 if k in d and (not isinstance(d[k], int) or isinstance(d[k], bool))]
        if wrong:
            raise TypeError(f"loader state {d}: {', '.join(wrong)} must be whole numbers"[:200])
        n = self.blocks.shape[0]
        if "n_blocks" in d and d["n_blocks"] != n:
            raise ValueError(f"loader state is for {d['n_blocks']} train blocks but this data has {n}: "
                             f"resume with the same data settings (source, tokenizer, seq_len, val_frac)")
        if not 0 <= d["position"] < n or d["epoch"] < 0:
            raise ValueError(f"loader state {d} is out of range for {n} blocks")
        self.seed, self.epoch, self.position = d["seed"], d["epoch"], d["position"]
        self._perm_epoch = -1


def val_batches(blocks: Tensor, batch_size: int, n_batches: int, rank: int = 0,
                world_size: int = 1) -> list[tuple[Tensor, Tensor]]:
    """A fixed validation set: the first n_batches * batch_size val blocks (wrapping around
    if there are fewer), as n_batches global batches, each cut to this rank's rows."""
    _check_split(batch_size, rank, world_size)
    if n_batches < 1 or blocks.shape[0] < 1:
        raise ValueError(f"need n_batches >= 1 and at least one val block (got {n_batches}, {blocks.shape[0]})")
    idx = torch.arange(n_batches * batch_size) % blocks.shape[0]
    return [_xy(blocks, b[rank::world_size]) for b in idx.view(n_batches, batch_size)]
