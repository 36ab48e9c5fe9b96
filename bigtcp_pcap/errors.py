"""The toolkit's errors: one base with an exit-code hint, one subclass per side of a failure.

``BigtcpError`` is what every command catches (one ``except`` per command): ``str(e)`` / ``e.one_line()`` is the
one line printed to stderr and ``e.exit_code`` the process exit code. The sides, as in h11's local/remote split:

* ``UsageError`` (2): the caller's side, a bad option, expression or environment (libpcap/libbpf missing);
* ``CaptureError`` (3): the data's side, a capture that cannot be read (past some point);
* ``OutputError`` (4): the output's side, a table that could not be written (read-only filesystem, a path that
  is a file, no permission, disk full);
* ``Interrupted`` (128 + signal number, the shell's convention): SIGINT / SIGTERM ended a run early.

Exit code 1 is not an error: it means "findings of severity warn or error present".
"""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

EXIT_USAGE, EXIT_CAPTURE, EXIT_OUTPUT = 2, 3, 4


class BigtcpError(Exception):
    """Base of the toolkit's errors; ``exit_code`` is the CLI's exit code for it."""

    exit_code: int = 1

    def one_line(self) -> str:
        """The message as one stderr line."""
        return " ".join(str(self).split("\n"))


class UsageError(BigtcpError):
    """A bad option value or expression given by the user, or a missing system library (exit code 2)."""

    exit_code = EXIT_USAGE


class CaptureError(BigtcpError):
    """The capture cannot be read past some point (exit code 3).

    ``frame`` is the 1-based number of the first frame that could not be read (the frames before it were
    decoded and are kept); ``offset`` is the byte offset in the (decompressed) capture stream.
    """

    exit_code = EXIT_CAPTURE

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


class OutputError(BigtcpError):
    """An output table or directory could not be written (exit code 4); ``path`` is the one that failed."""

    exit_code = EXIT_OUTPUT

    def __init__(self, path: str, message: str):
        self.path = path
        self.message = message
        super().__init__(f"{path}: {message}")

    @classmethod
    def from_os(cls, path: str, e: OSError, doing: str = "cannot write") -> OutputError:
        """From an OSError, with the system's text (``Read-only file system``, ``No space left on device``)."""
        return cls(path, f"{doing}: {os_text(e)}")


def make_outdir(path: str | os.PathLike) -> Path:
    """``mkdir -p`` for an output directory; a path that cannot be one (a file, no permission, read-only) is an
    ``OutputError``."""
    out = Path(path)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OutputError.from_os(str(out), e, "cannot make the output directory") from None
    return out


def os_text(e: OSError) -> str:
    """The system's text for an OSError, also from pyarrow's ("... Detail: [errno 28] No space left on device")."""
    m = re.search(r"\[errno (\d+)\]", str(e))
    if m:
        return os.strerror(int(m.group(1)))
    return e.strerror or str(e).splitlines()[0]


class Interrupted(BigtcpError):
    """SIGINT or SIGTERM stopped the run; the tables written are complete files marked partial."""

    def __init__(self, signum: int, detail: str = ""):
        self.signum = signum
        self.exit_code = 128 + signum
        name = signal.Signals(signum).name if signum in signal.Signals._value2member_map_ else f"signal {signum}"
        super().__init__(f"interrupted by {name}{': ' + detail if detail else ''}")
