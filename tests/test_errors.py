"""The error hierarchy (issue 18): one base with an exit-code hint, one subclass per side of a failure."""

from __future__ import annotations

import signal

import pytest

from bigtcp_pcap.audit.ebpf import EbpfError, EbpfLoadError, EbpfUsageError, LibbpfMissing
from bigtcp_pcap.audit.expr import ExprSyntaxError
from bigtcp_pcap.audit.libpcap import FilterError, LibpcapMissing
from bigtcp_pcap.errors import BigtcpError, CaptureError, Interrupted, OutputError, UsageError, os_text


@pytest.mark.parametrize("cls", [FilterError, LibpcapMissing, ExprSyntaxError, EbpfError, EbpfUsageError,
                                 EbpfLoadError, LibbpfMissing])
def test_audit_errors_are_usage_errors(cls):
    assert issubclass(cls, UsageError) and issubclass(cls, BigtcpError)


def test_exit_codes_and_one_line():
    assert UsageError("x").exit_code == 2
    e = CaptureError("f.pcap", "truncated record", frame=7, offset=123)
    assert e.exit_code == 3 and e.one_line() == "f.pcap (frame 7, byte offset 123): truncated record"
    assert OutputError("out/x.parquet", "cannot write: No space left on device").exit_code == 4
    assert Interrupted(signal.SIGINT).exit_code == 130 and Interrupted(signal.SIGTERM).exit_code == 143
    assert Interrupted(signal.SIGTERM).one_line() == "interrupted by SIGTERM"
    assert FilterError("tcp and", "syntax error").exit_code == 2


def test_the_old_bases_still_hold():
    """Callers that caught ValueError / RuntimeError keep working."""
    assert issubclass(FilterError, ValueError) and issubclass(ExprSyntaxError, ValueError)
    assert issubclass(LibpcapMissing, RuntimeError) and issubclass(EbpfError, RuntimeError)


def test_os_text_reads_pyarrow_messages():
    assert os_text(OSError("Error writing bytes to file. Detail: [errno 28] No space left on device")) == \
        "No space left on device"
    assert os_text(OSError(30, "Read-only file system")) == "Read-only file system"
