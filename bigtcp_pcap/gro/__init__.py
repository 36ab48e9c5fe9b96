"""GRO engine: rebuild the super-packets the Linux GRO receive path builds, with flush reasons (gro-spec.md).

Sans-IO: ``GroEngine.feed(PacketBatch, flow_id)`` in capture order, ``GroEngine.flush()`` at the end; both
return a ``SuperPacketBatch``. No files, no pandas, no CLI in here.
"""

from .config import GroConfig
from .engine import GroEngine
from .reasons import REASON_CODES, REASON_NAMES
from .superpacket import SOURCE_NAMES, SOURCE_OBSERVED, SOURCE_REBUILT, SuperPacketBatch

__all__ = [
    "REASON_CODES",
    "REASON_NAMES",
    "SOURCE_NAMES",
    "SOURCE_OBSERVED",
    "SOURCE_REBUILT",
    "GroConfig",
    "GroEngine",
    "SuperPacketBatch",
]
