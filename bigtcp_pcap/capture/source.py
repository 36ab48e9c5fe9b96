"""Opening a capture source: a path, ``-`` for stdin, or a binary file object; compression by magic bytes.

The stream handed to the record walk is always uncompressed. The raw (possibly compressed) bytes pass through
``HashingReader``, which counts them (the progress bar's position) and, when asked, takes their SHA-256. A
compressed stream is decompressed on a thread of its own (``ReadAhead``): zlib, bz2, lzma and zstandard release
the GIL while they work, so decompression runs beside the analysis instead of before it.
"""

from __future__ import annotations

import bz2
import contextlib
import hashlib
import io
import lzma
import os
import queue
import select
import stat
import sys
import threading
import zlib
from typing import BinaryIO

from ..errors import CaptureError

COMPRESSION_MAGICS = (
    (b"\x1f\x8b", "gzip"),
    (b"BZh", "bzip2"),
    (b"\xfd7zXZ\x00", "xz"),
    (b"\x28\xb5\x2f\xfd", "zstd"),
)


_WAITING = [False]  # the main thread is in a read of a live input (``HashingReader.live``)


def waiting_on_live_input() -> bool:
    """True while a read of a live input (a pipe, FIFO, socket or terminal) is in progress: it may wait for as
    long as the writer is quiet, so a signal handler that wants the run to end raises instead of waiting for the
    batch to complete (every record read before has been handed out: the reader asks for more bytes only to
    complete a record)."""
    return _WAITING[0]


class HashingReader(io.RawIOBase):
    """A raw reader that counts the bytes it hands out and, with ``sha256=True``, hashes them. ``live``: the raw
    stream is a live input, read one system call at a time (``waiting_on_live_input``)."""

    def __init__(self, raw: BinaryIO, head: bytes = b"", sha256: bool = False, live: bool = False):
        self._raw = raw
        self._head = head  # bytes already peeked from a non-seekable stream
        self.sha256 = hashlib.sha256() if sha256 else None
        self.position = 0
        self.live = live

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:  # type: ignore[override]
        mv = memoryview(b).cast("B")
        if self._head:
            n = min(len(mv), len(self._head))
            mv[:n] = self._head[:n]
            self._head = self._head[n:]
        else:
            _WAITING[0] = self.live
            try:
                n = self._raw.readinto(mv)
            finally:
                _WAITING[0] = False
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
        self._live_fd: int | None = None  # a live input's descriptor (pipe, FIFO, socket, terminal)
        if isinstance(source, (str, os.PathLike)) and str(source) == "-":
            raw = sys.stdin.buffer
            self.name = name or "<stdin>"
            self.size: int | None = None
            fd = _fileno(sys.stdin)  # (None: a stand-in without a descriptor, as a test runner's)
            if fd is not None and _live(fd):  # read as the bytes come, not a buffer's worth at a time
                self._live_fd = fd
                raw = io.FileIO(fd, "rb", closefd=False)
        elif isinstance(source, (str, os.PathLike)):
            self.name = name or str(source)
            try:
                raw = open(source, "rb", buffering=0)  # noqa: SIM115 - closed in close()
            except OSError as e:
                raise CaptureError(self.name, f"cannot open: {e.strerror or e}") from None
            self._close = raw
            if _live(raw.fileno()):
                self._live_fd = raw.fileno()
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
        self.compression = next((kind for magic, kind in COMPRESSION_MAGICS if head.startswith(magic)), None)
        if self.compression is not None:  # (the decompressing thread reads it: the main thread never waits on it)
            self._live_fd = None
        self.raw = HashingReader(raw, head, sha256=sha256, live=self._live_fd is not None)
        buffered = io.BufferedReader(self.raw, buffer_size=1 << 20)
        # what a damaged compressed stream raises while it is read (turned into a CaptureError by the reader)
        self.stream_errors: tuple[type[BaseException], ...] = (OSError, EOFError, ValueError, zlib.error,
                                                                lzma.LZMAError)
        self._ahead: ReadAhead | None = None
        if self.compression in ("gzip", "bzip2", "xz"):
            self._ahead = ReadAhead(Decompressing(buffered, self.compression))
        elif self.compression == "zstd":
            try:
                import zstandard
            except ImportError:
                raise CaptureError(self.name, "zstd-compressed; install the 'zstandard' package") from None
            self._ahead = ReadAhead(ZstdReader(buffered, zstandard))
            self.stream_errors += (zstandard.ZstdError,)
        # a live input one read at a time: a buffered reader waits until its request is full
        self.stream: BinaryIO = self._ahead if self._ahead is not None else \
            self.raw if self._live_fd is not None else buffered

    @property
    def live(self) -> bool:
        """The input is live (a pipe, FIFO, socket or terminal, uncompressed): ``idle`` says when it has nothing
        to read right now."""
        return self._live_fd is not None

    IDLE_S = 0.05
    """How long a live input must stay without bytes to be ``idle``: a writer feeding a pipe as fast as it can
    (``cat capture |``) leaves it empty for moments between its writes, and handing out each 64 KiB pipe's worth
    as a batch ran 3.4x slower than a full buffer (2 M receiver frames: 4.7-5.1 s against 1.4 s)."""

    def idle(self) -> bool:
        """A live input with no bytes to read for ``IDLE_S`` (False at once for every other input)."""
        if self._live_fd is None or self.raw._head:
            return False
        try:
            return not select.select([self._live_fd], [], [], self.IDLE_S)[0]
        except (OSError, ValueError):
            return False

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
        if self._ahead is not None:  # the decompressing thread reads the raw input no more
            self._ahead.close()
        buf = bytearray(1 << 20)
        try:
            while self.raw.readinto(buf):
                pass
        except OSError:
            pass

    def close(self) -> None:
        if self._ahead is not None:
            self._ahead.close()
        if self._close is not None:
            self._close.close()


class ReadAhead(io.RawIOBase):
    """The bytes of ``stream`` (a decompressing reader), read ahead on a thread into at most ``DEPTH`` pieces of
    ``PIECE`` bytes. ``readinto`` hands them out in order; what the stream raised (a truncated or corrupt
    compressed stream) is raised there once everything read before it has been handed out, as reading the
    stream itself would. The thread starts at the first read and ends at ``close`` (or at the stream's end)."""

    PIECE = 1 << 22
    DEPTH = 2

    def __init__(self, stream: BinaryIO):
        self._stream = stream
        self._q: queue.Queue = queue.Queue(self.DEPTH)
        self._cur = memoryview(b"")
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._over = False  # the end or the error has been handed out

    def readable(self) -> bool:
        return True

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                buf = bytearray(self.PIECE)
                n = self._stream.readinto(buf)
                if not n:
                    break
                if not self._put(memoryview(buf)[:n]):
                    return
        except BaseException as e:  # noqa: BLE001 - handed to the reader, raised where the stream raised it
            self._put(e)
            return
        self._put(None)

    def _put(self, item) -> bool:
        while not self._stop.is_set():
            try:
                self._q.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def readinto(self, b) -> int:  # type: ignore[override]
        mv = memoryview(b).cast("B")
        while not len(self._cur):
            if self._over:
                return 0
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="bigtcp-pcap-decompress", daemon=True)
                self._thread.start()
            item = self._q.get()
            if item is None:
                self._over = True
                return 0
            if isinstance(item, BaseException):
                self._over = True
                raise item
            self._cur = item
        n = min(len(mv), len(self._cur))
        mv[:n] = self._cur[:n]
        self._cur = self._cur[n:]
        return n

    def close(self) -> None:
        """Stop the thread (it is waiting to hand over a piece, or reading one) and drop what it read ahead."""
        self._stop.set()
        if self._thread is not None:
            while self._thread.is_alive():
                with contextlib.suppress(queue.Empty):
                    self._q.get(timeout=0.05)
            self._thread = None
        self._over = True
        self._cur = memoryview(b"")
        super().close()


# Compressed input is fed in pieces of this size; each call's output is bounded by the caller's buffer, so a
# decompression bomb costs what the reader asked for (a few MiB to sniff the magic), not what it expands to.
# Each call runs without the GIL and takes it back at its end: large pieces keep the decompressing thread from
# waiting for the GIL behind the analysis after every few hundred KB (64 KiB pieces: no overlap measured).
IN_CHUNK = 1 << 18
IN_SMALL = 1 << 12  # gzip: after a corrupt piece, its input again in pieces this small (little decoded is lost)


class Decompressing(io.RawIOBase):
    """gzip / bzip2 / xz members one after another, with output bounded per call and nothing decoded ever lost.

    The standard library's file objects (``gzip.GzipFile``, ...) read through a buffer that drops what it
    decoded when the stream turns out truncated or corrupt: a ``tcpdump -w - | gzip`` killed mid-run gave none
    of the packets it held. Here each ``readinto`` returns what it decoded, and the error (``EOFError`` for a
    stream that ends inside a member, the decompressor's own error for corrupt bytes) comes from the next call.
    """

    def __init__(self, raw: BinaryIO, kind: str):
        self._raw = raw
        self._kind = kind
        self._dec = self._new()
        self._pending = b""  # compressed input not yet given to the decompressor
        self._started = False  # the current member has consumed input
        self._step = IN_CHUNK

    def _new(self):
        if self._kind == "gzip":
            return zlib.decompressobj(16 + zlib.MAX_WBITS)
        return bz2.BZ2Decompressor() if self._kind == "bzip2" else lzma.LZMADecompressor()

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:  # type: ignore[override]
        mv = memoryview(b).cast("B")
        while True:
            if self._dec.eof:  # a member ended: what follows is the next one, or the end of the file
                rest = self._dec.unused_data + self._pending
                if self._kind == "gzip":  # gzip allows zero padding after a member (as gzip(1) and Python's gzip)
                    rest = rest.lstrip(b"\0")
                self._dec, self._pending, self._started = self._new(), rest, False
            data = self._pending
            if not data and self._wants_input():
                data = self._raw.read(self._step)
                if not data:
                    if self._started:
                        raise EOFError(f"{self._kind} stream ends inside a member (truncated file)")
                    return 0
            self._started = True
            if self._kind == "gzip":
                chunk, rest = data[:self._step], data[self._step:]
                # a corrupt point raises and drops what the call decoded: from a copy of the state before the
                # call, the same input again in small pieces, up to the error
                before = self._dec.copy() if len(chunk) > IN_SMALL else None
                try:
                    out = self._dec.decompress(chunk, len(mv))
                except zlib.error:
                    if before is None:
                        raise
                    self._dec, self._step, self._pending = before, IN_SMALL, data
                    continue
                self._pending = self._dec.unconsumed_tail + rest if rest else self._dec.unconsumed_tail
            else:
                out = self._dec.decompress(data, len(mv))
                self._pending = b""
            if out:
                mv[:len(out)] = out
                return len(out)

    def _wants_input(self) -> bool:
        if self._kind == "gzip":
            return not self._dec.unconsumed_tail
        return self._dec.needs_input


class _ZstdFrameWalk:
    """Follows the frame and block headers of a zstd stream (RFC 8878 section 3.1) as its bytes go by.

    zstandard's bounded ``stream_reader`` reports a stream cut inside a frame as a clean end of data, which
    would make a truncated capture look complete; this walk says whether the bytes seen so far end inside a
    frame. It reads 3 header bytes per block (at most 128 KiB) and skips the rest, so it costs next to nothing.
    """

    def __init__(self) -> None:
        self.state, self.need, self.skip, self.checksum = "magic", 4, 0, False
        self._buf = b""

    @property
    def inside(self) -> bool:
        return self.state not in ("magic", "unknown") or bool(self._buf) or self.skip > 0

    def feed(self, data: bytes) -> None:
        i, n = 0, len(data)
        while i < n and self.state != "unknown":
            if self.skip:
                k = min(self.skip, n - i)
                self.skip -= k
                i += k
                continue
            take = min(self.need - len(self._buf), n - i)
            self._buf += data[i:i + take]
            i += take
            while len(self._buf) >= self.need and self.state != "unknown":  # a field is complete
                field, self._buf = self._buf[:self.need], b""
                self._field(field)
                if self.need:
                    break

    def _field(self, f: bytes) -> None:
        v = int.from_bytes(f, "little")
        if self.state == "magic":
            if v == 0xFD2FB528:
                self.state, self.need = "fhd", 1
            elif v & 0xFFFFFFF0 == 0x184D2A50:  # skippable frame
                self.state, self.need = "skip_size", 4
            else:
                self.state = "unknown"  # the decompressor reports it
        elif self.state == "skip_size":
            self.state, self.need, self.skip = "magic", 4, v
        elif self.state == "fhd":
            single = bool(v & 0x20)
            fcs = (1 if single else 0, 2, 4, 8)[v >> 6]
            self.checksum = bool(v & 0x04)
            self.state, self.need = "header", (0 if single else 1) + (0, 1, 2, 4)[v & 3] + fcs
            if self.need == 0:
                self.state, self.need = "block", 3
        elif self.state == "header":
            self.state, self.need = "block", 3
        elif self.state == "block":
            last, btype, size = v & 1, (v >> 1) & 3, v >> 3
            self.skip = 1 if btype == 1 else size
            if not last:
                self.need = 3
            elif self.checksum:
                self.state, self.need = "checksum", 4
            else:
                self.state, self.need = "magic", 4
        elif self.state == "checksum":
            self.state, self.need = "magic", 4


class _Tee:
    """A reader that shows every byte it hands out to a ``_ZstdFrameWalk``."""

    def __init__(self, raw: BinaryIO, walk: _ZstdFrameWalk):
        self._raw, self._walk = raw, walk

    def read(self, n: int = -1) -> bytes:
        data = self._raw.read(n)
        self._walk.feed(data)
        return data


class ZstdReader(io.RawIOBase):
    """zstd frames one after another, output bounded per call, raising EOFError when the input ends in a frame."""

    def __init__(self, raw: BinaryIO, zstandard):
        self._walk = _ZstdFrameWalk()
        self._reader = zstandard.ZstdDecompressor().stream_reader(_Tee(raw, self._walk), read_size=IN_CHUNK,
                                                                   read_across_frames=True)

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:  # type: ignore[override]
        n = self._reader.readinto(b)
        if not n and self._walk.inside:
            raise EOFError("zstd stream ends inside a frame (truncated file)")
        return n


def _fileno(f) -> int | None:
    try:
        return f.fileno()
    except (OSError, ValueError, AttributeError):  # io.UnsupportedOperation is both of the first two
        return None


def _live(fd: int) -> bool:
    """The descriptor is not a regular file or block device (its reads return what has arrived so far)."""
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        return False
    return not (stat.S_ISREG(mode) or stat.S_ISBLK(mode))


def _read_exactly(raw: BinaryIO, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = raw.read(n - len(out))
        if not chunk:
            break
        out += chunk
    return out
