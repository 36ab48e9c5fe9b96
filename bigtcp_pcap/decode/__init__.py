"""Decoding: record batches to PacketBatch columns plus finding rows."""

from .decode import FindingRows, decode
from .schema import BIGTCP_NAMES, PacketBatch

__all__ = ["BIGTCP_NAMES", "FindingRows", "PacketBatch", "decode"]
