"""Opening a capture source: a path, ``-`` for stdin, or a binary file object; compression by magic bytes.

The stream handed to the record walk is always uncompressed. The raw (possibly compressed) bytes pass through
``HashingReader``, which counts them (the progress bar's position) and, when asked, takes their SHA-256.
"""

from __future__ import annotations

import bz2
import gzip
import hashlib
import io
import lzma
import os
import sys
import zlib
from typing import BinaryIO

from ..errors import CaptureError

COMPRESSION_MAGICS = (
    (b"\x1f\x8b", "gzip"),
    (b"BZh", "bzip2"),
    (b"\xfd7zXZ\x00", "xz"),
    (b"\x28\xb5\x2f\xfd", "zstd"),
)


class HashingReader(io.RawIOBase):
    """A raw reader that counts the bytes it hands out and, with ``sha256=True``, hashes them."""

    def __init__(self, raw: BinaryIO, head: bytes = b"", sha256: bool = False):
        self._raw = raw
        self._head = head  # bytes already peeked from a non-seekable stream
        self.sha256 = hashlib.sha256() if sha256 else None
        self.position = 0

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:  # type: ignore[override]
        mv = memoryview(b).cast("B")
        if self._head:
            n = min(len(mv), len(self._head))
            mv[:n] = self._head[:n]
            self._head = self._head[n:]
        else:
            n = self._raw.readinto(mv)
            if not n:
                return 0
        if self.sha256 is not None:
            self.sha256.update(mv[:n])
        self.position += n
        return n


class Source:
    """An open capture stream: ``stream`` gives the uncompressed bytes."""

    def __init__(self, source: str | os.PathLike | BinaryIO, *, name: str | None = None, sha256: bool = False):
        self._close = None
        if isinstance(source, (str, os.PathLike)) and str(source) == "-":
            raw = sys.stdin.buffer
            self.name = name or "<stdin>"
            self.size: int | None = None
        elif isinstance(source, (str, os.PathLike)):
            self.name = name or str(source)
            try:
                raw = open(source, "rb")  # noqa: SIM115 - closed in close()
            except OSError as e:
                raise CaptureError(self.name, f"cannot open: {e.strerror or e}") from None
            self._close = raw
            try:
                st = os.fstat(raw.fileno())
                self.size = st.st_size if st.st_size > 0 or os.path.isfile(source) else None
            except OSError:
                self.size = None
        else:
            raw = source
            self.name = name or getattr(source, "name", "<stream>")
            self.size = None
        head = _read_exactly(raw, 6)
        self.raw = HashingReader(raw, head, sha256=sha256)
        self.compression = next((kind for magic, kind in COMPRESSION_MAGICS if head.startswith(magic)), None)
        buffered = io.BufferedReader(self.raw, buffer_size=1 << 20)
        # what a damaged compressed stream raises while it is read (turned into a CaptureError by the reader)
        self.stream_errors: tuple[type[BaseException], ...] = (OSError, EOFError, ValueError, zlib.error,
                                                                lzma.LZMAError)
        if self.compression == "gzip":
            self.stream: BinaryIO = gzip.GzipFile(fileobj=buffered, mode="rb")
        elif self.compression == "bzip2":
            self.stream = bz2.BZ2File(buffered, "rb")
        elif self.compression == "xz":
            self.stream = lzma.LZMAFile(buffered, "rb")  # noqa: SIM115 - open for the reader's life, closed by close()
        elif self.compression == "zstd":
            try:
                import zstandard
            except ImportError:
                raise CaptureError(self.name, "zstd-compressed; install the 'zstandard' package") from None
            self.stream = ZstdReader(buffered, zstandard)
            self.stream_errors += (zstandard.ZstdError,)
        else:
            self.stream = buffered

    @property
    def bytes_read(self) -> int:
        """Raw (compressed, as stored) bytes consumed so far."""
        return self.raw.position

    def sha256_hex(self) -> str | None:
        return self.raw.sha256.hexdigest() if self.raw.sha256 is not None else None

    def drain(self) -> None:
        """Read the raw input to its end so that the SHA-256 covers the whole file."""
        if self.raw.sha256 is None:
            return
        buf = bytearray(1 << 20)
        try:
            while self.raw.readinto(buf):
                pass
        except OSError:
            pass

    def close(self) -> None:
        if self._close is not None:
            self._close.close()


class ZstdReader(io.RawIOBase):
    """zstd frames one after another, raising EOFError when the input ends inside a frame.

    (zstandard's stream_reader reports a frame cut short as a clean end of data, which would make a truncated
    capture look complete.)
    """

    def __init__(self, raw: BinaryIO, zstandard):
        self._raw = raw
        self._zstd = zstandard
        self._dobj = zstandard.ZstdDecompressor().decompressobj()
        self._out = b""
        self._pos = 0  # bytes of _out already handed out (the rest is not re-sliced per call: a copy each time)
        self._in_frame = False

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:  # type: ignore[override]
        while self._pos >= len(self._out):
            chunk = self._raw.read(1 << 17)
            if not chunk:
                if self._in_frame:
                    raise EOFError("zstd stream ends inside a frame (truncated file)")
                return 0
            parts = []
            while chunk:
                self._in_frame = True
                parts.append(self._dobj.decompress(chunk))
                chunk = b""
                if self._dobj.eof:  # frame complete; the rest of the chunk starts the next frame
                    chunk = self._dobj.unused_data
                    self._dobj = self._zstd.ZstdDecompressor().decompressobj()
                    self._in_frame = False
            self._out = parts[0] if len(parts) == 1 else b"".join(parts)
            self._pos = 0
        n = min(len(b), len(self._out) - self._pos)
        memoryview(b).cast("B")[:n] = memoryview(self._out)[self._pos:self._pos + n]
        self._pos += n
        return n


def _read_exactly(raw: BinaryIO, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = raw.read(n - len(out))
        if not chunk:
            break
        out += chunk
    return out
