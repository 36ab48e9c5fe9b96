"""Errors for bad user input: one type, one line, always naming the file, frame and byte offset."""

from __future__ import annotations


class CaptureError(Exception):
    """The capture cannot be read past some point.

    ``frame`` is the 1-based number of the first frame that could not be read (the frames before it were
    decoded and are kept); ``offset`` is the byte offset in the (decompressed) capture stream.
    """

    def __init__(self, source: str, message: str, *, frame: int | None = None, offset: int | None = None):
        self.source = source
        self.message = message
        self.frame = frame
        self.offset = offset
        super().__init__(self.one_line())

    def one_line(self) -> str:
        where = []
        if self.frame is not None:
            where.append(f"frame {self.frame}")
        if self.offset is not None:
            where.append(f"byte offset {self.offset}")
        loc = f" ({', '.join(where)})" if where else ""
        return f"{self.source}{loc}: {self.message}"


class UsageError(Exception):
    """A bad option value or expression given by the user (exit code 2)."""
