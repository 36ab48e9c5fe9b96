"""GRO engine: rebuild the super-packets the Linux GRO receive path builds, with flush reasons (gro-spec.md).

Sans-IO: ``GroEngine.feed(PacketBatch, flow_id)`` in capture order, ``GroEngine.flush()`` at the end; both
return a ``SuperPacketBatch``. ``CompiledGroEngine`` has the same interface and identical output, with the
per-packet loop compiled (numba); ``make_engine("compiled" | "reference", config)`` picks one by name.
No files, no pandas, no CLI in here.
"""

from .compiled import CompiledGroEngine
from .config import GroConfig
from .engine import GroEngine
from .reasons import REASON_CODES, REASON_NAMES
from .superpacket import SOURCE_NAMES, SOURCE_OBSERVED, SOURCE_REBUILT, SuperPacketBatch

GRO_ENGINES = {"compiled": CompiledGroEngine, "reference": GroEngine}
"""Engine implementations by name: identical rows; "compiled" (numba) is the fast default."""


def make_engine(name: str = "compiled", config: GroConfig | None = None) -> CompiledGroEngine | GroEngine:
    """A GRO engine by name ("compiled" or "reference"); ValueError for any other name."""
    try:
        cls = GRO_ENGINES[name]
    except (KeyError, TypeError):
        raise ValueError(f"gro_engine must be one of {sorted(GRO_ENGINES)}, got {name!r}") from None
    return cls(config)


__all__ = [
    "GRO_ENGINES",
    "REASON_CODES",
    "REASON_NAMES",
    "SOURCE_NAMES",
    "SOURCE_OBSERVED",
    "SOURCE_REBUILT",
    "CompiledGroEngine",
    "GroConfig",
    "GroEngine",
    "SuperPacketBatch",
    "make_engine",
]
