"""Which host receives each frame: one GRO/NAPI model per receiving host, never mixed.

gro-spec section 1: GRO state and the NAPI budget belong to one RX queue of one device. A capture taken on a
sender (or a mirror port) holds both directions, so the ACKs coming back must not count into the budget of the
host that receives the data, and two receivers must not share a GRO table. ``Receivers.assign`` gives every
frame the index of the host that receives it; the engine keeps ``rx_queues`` NAPI instances per index.

How the receiver is told, per link type:

* Ethernet (1): the destination MAC address. A group-addressed frame (broadcast, multicast: ARP, ND) goes to
  the host that last received a unicast frame from the same source, where known, else to a receiver of its
  own (it then touches no GRO state of a data receiver);
* Linux cooked captures (SLL 113, SLL2 276): the packet type says the direction on the capturing host: frames
  it received (host, broadcast, multicast, other-host) go to the capturing host, frames it sent go to their
  destination IP address;
* every other link type (raw IP, NULL, LOOP, ...): the destination IP address;
* a frame with none of these (not IP, too short): a receiver per capture interface.

Every key also holds the capture interface (pcapng ``if_id``), so two interfaces never share a receiver.
Vectorized per batch; Python touches only the distinct receivers of a batch.
"""

from __future__ import annotations

import ipaddress

import numpy as np

from ..capture.reader import RecordBatch
from ..decode.schema import PacketBatch

K_MAC, K_LOCAL, K_IP4, K_NONE, K_GROUP, K_IP6 = 1, 2, 3, 4, 5, 6
SLL_OUTGOING = 4  # PACKET_OUTGOING
LT_ETHERNET, LT_SLL, LT_SLL2 = 1, 113, 276


def _u64_be(buf: np.ndarray, off: np.ndarray, n: int) -> np.ndarray:
    """n bytes from each offset as a big-endian unsigned integer (n <= 8)."""
    b = buf[off[:, None] + np.arange(n)[None, :]].astype(np.uint64)
    return (b << (np.arange(n - 1, -1, -1, dtype=np.uint64) * np.uint64(8))[None, :]).sum(axis=1, dtype=np.uint64)


class Receivers:
    """Receiving-host index per frame, stable across batches (see the module docstring)."""

    def __init__(self) -> None:
        self._index: dict[bytes, int] = {}
        self.labels: list[str] = []
        self._peer: dict[tuple[int, int], int] = {}  # (if_id, source MAC) -> the MAC it last sent unicast to

    def __len__(self) -> int:
        return len(self.labels)

    def assign(self, rb: RecordBatch, pb: PacketBatch) -> np.ndarray:
        """int64 receiver index per frame of the batch."""
        n = len(pb)
        kind = np.full(n, K_NONE, np.uint64)
        a = np.zeros(n, np.uint64)  # first key word (MAC, or address high half)
        b = np.zeros(n, np.uint64)  # second key word (address low half)
        lt = pb.linktype
        cap = rb.caplen
        ip = (pb.ip_version == 4) | (pb.ip_version == 6)
        dst = np.ascontiguousarray(pb.dst).view(">u8").reshape(n, 2).astype(np.uint64) if n else np.zeros((0, 2),
                                                                                                         np.uint64)
        # the destination IP address, wherever nothing better is known
        kind[ip] = np.where(pb.ip_version[ip] == 4, K_IP4, K_IP6).astype(np.uint64)
        a[ip] = dst[ip, 0]
        b[ip] = dst[ip, 1]
        eth = (lt == LT_ETHERNET) & (cap >= 12)
        if eth.any():
            dmac = _u64_be(rb.buf, rb.off[eth], 6)
            smac = _u64_be(rb.buf, rb.off[eth] + 6, 6)
            group = ((dmac >> np.uint64(40)) & np.uint64(1)) != 0
            mac = dmac.copy()
            if group.any():
                mac[group] = self._group_targets(pb.if_id[eth], smac, dmac, group)
            idx = np.flatnonzero(eth)
            kind[idx] = np.where(mac == 0, K_GROUP, K_MAC).astype(np.uint64)
            a[idx] = np.where(mac == 0, dmac, mac)
            b[idx] = 0
        for ltype, at in ((LT_SLL, 0), (LT_SLL2, 10)):
            sll = (lt == ltype) & (cap >= at + 2)
            if sll.any():
                ptype = _u64_be(rb.buf, rb.off[sll] + at, 2 if ltype == LT_SLL else 1)
                idx = np.flatnonzero(sll)
                incoming = ptype != SLL_OUTGOING
                kind[idx[incoming]] = K_LOCAL
                a[idx[incoming]] = 0
                b[idx[incoming]] = 0
        keys = np.stack([kind, a, b, pb.if_id.astype(np.uint64)], axis=1)
        keys = np.ascontiguousarray(keys).view(np.dtype((np.void, 32))).reshape(-1)
        uniq, inv = np.unique(keys, return_inverse=True)
        ids = np.empty(len(uniq), np.int64)
        for j, k in enumerate(uniq.tolist()):
            ids[j] = self._id(bytes(k))
        return ids[inv.reshape(-1)]

    def _group_targets(self, if_id: np.ndarray, smac: np.ndarray, dmac: np.ndarray, group: np.ndarray) -> np.ndarray:
        """For group-addressed frames: the MAC their source last sent a unicast frame to (0 when unknown)."""
        uni = ~group
        if uni.any():  # remember the last unicast destination of each (interface, source)
            pairs = np.stack([if_id[uni].astype(np.uint64), smac[uni], dmac[uni]], axis=1)[::-1]
            _, first = np.unique(pairs[:, :2], axis=0, return_index=True)
            for i_f, s, d in pairs[first].tolist():
                self._peer[(i_f, s)] = d
        out = np.zeros(int(group.sum()), np.uint64)
        for j, (i_f, s) in enumerate(zip(if_id[group].tolist(), smac[group].tolist(), strict=True)):
            out[j] = self._peer.get((i_f, s), 0)
        return out

    def _id(self, key: bytes) -> int:
        i = self._index.get(key)
        if i is None:
            i = len(self.labels)
            self._index[key] = i
            self.labels.append(_label(key))
        return i


def _label(key: bytes) -> str:
    kind, a, b, if_id = np.frombuffer(key, np.uint64).tolist()
    where = f" (interface {if_id})" if if_id else ""
    if kind == K_MAC:
        return ":".join(f"{(a >> s) & 0xFF:02x}" for s in range(40, -8, -8)) + where
    if kind == K_IP4:
        return str(ipaddress.IPv4Address(a >> 32)) + where
    if kind == K_IP6:
        return str(ipaddress.IPv6Address((a << 64) | b)) + where
    if kind == K_LOCAL:
        return f"capturing host{where}"
    if kind == K_GROUP:
        return "group " + ":".join(f"{(a >> s) & 0xFF:02x}" for s in range(40, -8, -8)) + where
    return f"non-IP frames{where}"
