"""Capture reading: sources (files, stdin, compressed) and the streaming pcap/pcapng record walk."""

from .reader import CaptureInfo, CaptureReader, RecordBatch, read_batches

__all__ = ["CaptureInfo", "CaptureReader", "RecordBatch", "read_batches"]
