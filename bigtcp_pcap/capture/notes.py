"""Capture-level notes: facts counted over a whole run and reported as one finding row each at the end.

A condition that can hold for millions of frames (records longer than the snaplen, frames of a link type the
decoder does not read, the TPACKET_V2 clamp) is not a row per frame: it is a count, the first frame that shows
it, and a value (a link type, a snaplen). ``rows()`` turns the counts into finding rows (frame = first frame).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .. import findings as F


@dataclass
class Note:
    """One counted condition: how many frames, the first one, and the value the message names."""

    code: int  # findings id
    value: int  # what the message's {value} names (a link type, a snaplen, ...)
    count: int = 0
    first_frame: int = 0


@dataclass
class CaptureNotes:
    """Counted capture-level conditions, keyed by (finding id, value)."""

    notes: dict[tuple[int, int], Note] = field(default_factory=dict)

    def count(self, code: int, value: int, frames: np.ndarray) -> None:
        """Count ``frames`` (the frame numbers showing the condition, ascending) under (code, value)."""
        if frames.shape[0] == 0:
            return
        note = self.notes.get((code, value))
        if note is None:
            note = self.notes[(code, value)] = Note(code, value, first_frame=int(frames[0]))
        note.count += int(frames.shape[0])

    def count_by_value(self, code: int, values: np.ndarray, frames: np.ndarray) -> None:
        """Like ``count`` for rows that each carry their own value (e.g. the link type of each frame)."""
        if values.shape[0] == 0:
            return
        for v in np.unique(values, return_counts=True)[0].tolist():  # (return_counts: np.unique then skips numpy.ma)
            self.count(code, int(v), frames[values == v])

    def total(self, code: int) -> int:
        """Frames counted under ``code``, all values together."""
        return sum(n.count for (c, _), n in self.notes.items() if c == code)

    def by_value(self, code: int) -> dict[int, int]:
        """{value: frames} under ``code``."""
        return {v: n.count for (c, v), n in sorted(self.notes.items()) if c == code}

    def rows(self) -> dict[str, list]:
        """Finding columns, one row per (code, value), ordered by first frame."""
        cols: dict[str, list] = {"frame": [], "code": [], "severity": [], "message": []}
        for n in sorted(self.notes.values(), key=lambda n: (n.first_frame, n.code, n.value)):
            c = F.BY_ID[n.code]
            cols["frame"].append(n.first_frame)
            cols["code"].append(c.code)
            cols["severity"].append(c.severity)
            cols["message"].append(f"{c.template.format(value=n.value)}: {n.count} frame{'s' * (n.count != 1)}, "
                                   f"the first is frame {n.first_frame}")
        return cols
