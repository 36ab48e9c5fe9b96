"""The GRO stage of the pipeline: receivers routed, ACK evidence looked up, the engine fed.

``analyze`` and ``compare`` both use it, so a comparison measures exactly what ``analyze`` builds::

    stage = GroStage(GroConfig(gro_max_size=185000))
    for rb in reader:                       # RecordBatch (for the link-layer addresses) ...
        pb, _ = decode(rb)                  # ... and its decoded PacketBatch
        rows = stage.feed(rb, pb, flow_id)  # SuperPacketBatch completed meanwhile (may lag the evidence window)
    rows = stage.finish()                   # the rest, at the end of the capture

With ``ack_evidence`` a batch is fed to the engine once ``evidence.WINDOW`` later rows have been seen (the
lookahead of ``evidence.AckEvidence``); with ``split_receivers`` every frame goes to the NAPI model of the host
that receives it (``receivers.Receivers``, whose ``labels`` name the ``receiver`` index of each row).
"""

from __future__ import annotations

import numpy as np

from ..capture.reader import RecordBatch
from ..decode.schema import PacketBatch
from .config import GroConfig
from .evidence import AckEvidence
from .receivers import Receivers
from .superpacket import SuperPacketBatch


class GroStage:
    """Receivers + ACK evidence + a GRO engine (see the module docstring)."""

    def __init__(self, config: GroConfig, engine: str = "compiled") -> None:
        from . import make_engine

        self.config = config
        self.engine = make_engine(engine, config)
        self.receivers = Receivers()
        self._evidence = AckEvidence() if config.ack_evidence else None
        self.last_receivers: np.ndarray | None = None  # the receiver index of each packet of the last feed

    @property
    def labels(self) -> list[str]:
        """Receiver names, indexed by a row's ``receiver``."""
        return self.receivers.labels if self.config.split_receivers else ["capture interface"]

    def feed(self, rb: RecordBatch, pb: PacketBatch, flow_id: np.ndarray) -> SuperPacketBatch:
        rx = self.receivers.assign(rb, pb) if self.config.split_receivers else None
        self.last_receivers = rx
        if self._evidence is None:
            return self.engine.feed(pb, flow_id, receiver=rx)
        ready = self._evidence.push(pb, (flow_id, rx))
        return self._run(ready)

    def finish(self) -> SuperPacketBatch:
        """End of input: the held batches, then every held super-packet (end_of_capture)."""
        parts = [self._run(self._evidence.finish())] if self._evidence is not None else []
        parts.append(self.engine.flush())
        return SuperPacketBatch.concat(parts)

    def held_flow_ids(self) -> np.ndarray:
        """Flow ids of the entries the engine holds (their super-packet rows are still to come; ids may repeat)."""
        return self.engine.held_flow_ids()

    def pending_from_frame(self) -> int | None:
        """The first frame the ACK lookahead holds and has not fed to the engine yet (None: none). A flow with a
        packet there or later still has rows to come: the flow table keeps it (it writes a flow only when its
        rows are out)."""
        return self._evidence.pending_from_frame() if self._evidence is not None else None

    def recycle(self, flow_in_memory) -> int:
        """The engine forgets the keys of flows that have ended (``CompiledGroEngine.recycle``)."""
        return self.engine.recycle(flow_in_memory)

    def _run(self, ready: list) -> SuperPacketBatch:
        """Feed the engine the batches the ACK evidence has flagged (oldest first)."""
        if not ready:
            return SuperPacketBatch.empty(0)
        out = [self.engine.feed(pb, fid, acked=acked, receiver=rx) for pb, (fid, rx), acked in ready]
        return out[0] if len(out) == 1 else SuperPacketBatch.concat(out)
