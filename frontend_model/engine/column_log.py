"""What each slot of an engine consumed, kept on the device as it steps: the record a session's history is read from
(`history.py`), written by the engine's hooks."""

from __future__ import annotations

from typing import Any

import torch

EMBEDDED = -3  # a position a prefix filled with replayed embeddings, not a column (a PersonaPlex voice prompt)


class ColumnLog:
    """Each slot's consumed columns by stream position, modulo `keep + 1` positions, on the device.

    Written by the engine's hooks after every step, span and prefix (no host read); the one slot more than `keep`
    leaves the kept window intact when a batched step is undone after it was written (BatchEngine's fault path)."""

    def __init__(self, slots: int, rows: int, keep: int, device: torch.device) -> None:
        if keep < 1:
            raise ValueError(f"keep must be at least 1, got {keep}")
        self.keep = keep
        self.columns = torch.zeros(slots, rows, keep + 1, dtype=torch.int32, device=device)

    def stepped(self, state: Any, delays: torch.Tensor) -> None:
        """After LMGen's step (its state): each executed row read the column at its previous position from the
        token ring (the initial tokens where that position is within a row's delay)."""
        position = state.offsets - 1
        ring = state.cache
        at = (position % ring.shape[2])[:, None, None].expand(-1, ring.shape[1], 1)
        column = torch.where(position[:, None] <= delays[None], state.initial[:, :, 0], ring.gather(2, at)[..., 0])
        slot = (position % self.columns.shape[2])[:, None, None].expand(-1, ring.shape[1], 1)
        kept = self.columns.gather(2, slot)[..., 0]
        self.columns.scatter_(2, slot, torch.where(state.exec_mask[:, None], column.int(), kept)[..., None])

    def recent(self, slot: int, offset: int, n: int) -> torch.Tensor:
        """`slot`'s columns at positions offset - n .. offset - 1, [rows, n] int32 on the device."""
        if not 0 <= n <= min(self.keep, offset):
            raise ValueError(f"{n} columns before position {offset}; this log keeps {self.keep}")
        at = torch.arange(offset - n, offset, device=self.columns.device) % self.columns.shape[2]
        return self.columns[slot][:, at]

    def forced(self, lo: int, start: torch.Tensor, columns: torch.Tensor, embedded: int = 0) -> None:
        """`columns` [rows lo.., rows, n] written into the stream from positions `start` [rows lo..] on, after
        `embedded` positions filled with replayed embeddings (marked EMBEDDED)."""
        if embedded:
            marks = columns.new_full((*columns.shape[:2], embedded), EMBEDDED)
            columns = torch.cat([marks, columns], dim=2)
        capacity = self.columns.shape[2]
        skip = max(0, columns.shape[2] - capacity)  # older ones would be overwritten at once
        columns = columns[..., skip:]
        at = (start[:, None] + skip + torch.arange(columns.shape[2], device=columns.device)[None]) % capacity
        self.columns[lo : lo + columns.shape[0]].scatter_(2, at[:, None].expand(-1, columns.shape[1], -1),
                                                          columns.int())
