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
  it received (host, broadcast, multicast, other-host) go to the capturing host (SLL2: to its interface that
  received them, by ifindex: each device has its own NAPI), frames it sent go to their destination IP address;
* every other link type (raw IP, NULL, LOOP, ...): the destination IP address;
* a frame with none of these (not IP, too short): a receiver per capture interface.

Every key also holds the capture interface (pcapng ``if_id``), so two interfaces never share a receiver.
One compiled pass per batch (``receiver_keys``); Python touches only the distinct receivers of a batch.
"""

from __future__ import annotations

import ipaddress

import numpy as np

from .._native import njit
from ..capture.reader import RecordBatch
from ..decode.schema import PacketBatch
from ..flows.table import _fmix

K_MAC, K_LOCAL, K_IP4, K_NONE, K_GROUP, K_IP6 = 1, 2, 3, 4, 5, 6
SLL_OUTGOING = 4  # PACKET_OUTGOING
LT_ETHERNET, LT_SLL, LT_SLL2 = 1, 113, 276
_SEED = np.uint64(0x9E3779B97F4A7C15)


@njit(cache=True, inline="always")
def _be(buf, o, n):
    """n bytes at ``buf[o:]`` as a big-endian unsigned integer (n <= 8)."""
    x = np.uint64(0)
    for k in range(n):
        x = (x << np.uint64(8)) | np.uint64(buf[o + k])
    return x


@njit(cache=True, inline="always")
def _peer_slot(PK, PU, i_f, s):
    """The slot of (interface, source MAC) in the peer map, or the empty slot where it would go."""
    m = np.int64(PU.shape[0] - 1)
    j = np.int64(_fmix(_fmix(_SEED, i_f), s) & np.uint64(m))
    while PU[j] and (PK[j, 0] != i_f or PK[j, 1] != s):
        j = (j + 1) & m
    return j


@njit(cache=True, entry=True,
      sig=("u16[::1], u32[::1], u8[::1], u8[:, ::1], u32[::1], u8[::1], i64[::1], u64[:, ::1], u64[::1], b1[::1], "
           "i64[::1], u64[:, ::1], i64[::1], i64[::1], u64[:, ::1]"))
def receiver_keys(lt, cap, ver, dst, if_id, buf, off, PK, PV, PU, PST, UK, TAB, inv, KEY):
    """The receiver key (kind, word a, word b, interface) of each frame into KEY, the distinct keys of the batch
    in order of first appearance into UK (returns how many), and each frame's row of UK into ``inv``.

    The peer map (PK/PV/PU, fill in PST[0], kept at most half full by the caller) remembers, per (interface,
    source MAC), the MAC it last sent a unicast frame to: the whole batch's unicast frames update it first, then
    the group-addressed frames look their source up (0 when unknown: a receiver of their own). TAB is scratch
    (power of two >= 2n); KEY holds each Ethernet frame's two MACs between the passes, so the frame's bytes are
    read once (that read, a cache miss per frame, was most of this pass's time). A conversation's back and
    forth (two peers, two receivers alternating) reuses the last two lookups in both maps."""
    n = lt.shape[0]
    ms0 = ms1 = np.int64(-1)  # the peer slots of the last two sources seen (both directions of a conversation)
    mi0 = mi1 = ma0 = ma1 = np.uint64(0)
    for i in range(n):  # the unicast frames of the batch teach the peer map (the last one wins)
        if lt[i] == LT_ETHERNET and cap[i] >= 12:
            d = _be(buf, off[i], 6)
            s = _be(buf, off[i] + 6, 6)
            KEY[i, 1] = d  # the frame's MACs, for the second pass (one read of the frame's bytes, not two)
            KEY[i, 2] = s
            if (d >> np.uint64(40)) & np.uint64(1) == 0:
                i_f = np.uint64(if_id[i])
                if ms0 >= 0 and ma0 == s and mi0 == i_f:
                    j = ms0
                elif ms1 >= 0 and ma1 == s and mi1 == i_f:
                    j = ms1
                else:
                    j = _peer_slot(PK, PU, i_f, s)
                    if not PU[j]:
                        PU[j] = True
                        PK[j, 0] = i_f
                        PK[j, 1] = s
                        PST[0] += 1
                    ms1, mi1, ma1 = ms0, mi0, ma0  # (slots do not move within a call: no rehash here)
                    ms0, mi0, ma0 = j, i_f, s
                PV[j] = d
    for i in range(n):
        kind, a, b = np.uint64(K_NONE), np.uint64(0), np.uint64(0)
        t = lt[i]
        if t == LT_ETHERNET and cap[i] >= 12:
            d = KEY[i, 1]
            mac = d
            if (d >> np.uint64(40)) & np.uint64(1) != 0:
                j = _peer_slot(PK, PU, np.uint64(if_id[i]), KEY[i, 2])
                mac = PV[j] if PU[j] else np.uint64(0)
            kind = np.uint64(K_GROUP if mac == 0 else K_MAC)
            a = d if mac == 0 else mac
        elif t == LT_SLL and cap[i] >= 2 and _be(buf, off[i], 2) != SLL_OUTGOING:
            kind = np.uint64(K_LOCAL)
        elif t == LT_SLL2 and cap[i] >= 12 and _be(buf, off[i] + 10, 1) != SLL_OUTGOING:
            kind = np.uint64(K_LOCAL)  # one receiver per receiving interface of the capturing host (its ifindex)
            a = _be(buf, off[i] + 4, 4)
        else:
            v = ver[i]
            if v == 4 or v == 6:  # the destination IP address, wherever nothing better is known
                kind = np.uint64(K_IP4 if v == 4 else K_IP6)
                for k in range(8):
                    a = (a << np.uint64(8)) | np.uint64(dst[i, k])
                    b = (b << np.uint64(8)) | np.uint64(dst[i, 8 + k])
        KEY[i, 0] = kind
        KEY[i, 1] = a
        KEY[i, 2] = b
        KEY[i, 3] = np.uint64(if_id[i])
    m = np.int64(TAB.shape[0] - 1)
    TAB[:] = -1
    u = 0
    alt = np.int64(-1)  # the row of UK before the previous row's (the other direction of a conversation)
    for i in range(n):  # distinct keys, first appearance first
        if i and KEY[i, 0] == KEY[i - 1, 0] and KEY[i, 1] == KEY[i - 1, 1] and KEY[i, 2] == KEY[i - 1, 2] \
                and KEY[i, 3] == KEY[i - 1, 3]:
            inv[i] = inv[i - 1]  # runs of one receiver skip the table
            continue
        if alt >= 0 and UK[alt, 0] == KEY[i, 0] and UK[alt, 1] == KEY[i, 1] and UK[alt, 2] == KEY[i, 2] \
                and UK[alt, 3] == KEY[i, 3]:
            inv[i] = alt  # and so does a conversation's back and forth
            alt = inv[i - 1]
            continue
        if i:
            alt = inv[i - 1]
        h = _fmix(_fmix(_fmix(_fmix(_SEED, KEY[i, 0]), KEY[i, 1]), KEY[i, 2]), KEY[i, 3])
        j = np.int64(h & np.uint64(m))
        while True:
            r = TAB[j]
            if r < 0:
                TAB[j] = u
                for w in range(4):
                    UK[u, w] = KEY[i, w]
                inv[i] = u
                u += 1
                break
            if UK[r, 0] == KEY[i, 0] and UK[r, 1] == KEY[i, 1] and UK[r, 2] == KEY[i, 2] and UK[r, 3] == KEY[i, 3]:
                inv[i] = r
                break
            j = (j + 1) & m
    return u


class Receivers:
    """Receiving-host index per frame, stable across batches (see the module docstring)."""

    def __init__(self) -> None:
        self._index: dict[bytes, int] = {}
        self.labels: list[str] = []
        # (interface, source MAC) -> the MAC it last sent unicast to: an open-addressing map the kernel keeps
        self._pk, self._pv, self._pu = np.zeros((16, 2), np.uint64), np.zeros(16, np.uint64), np.zeros(16, np.bool_)
        self._pst = np.zeros(1, np.int64)

    def __len__(self) -> int:
        return len(self.labels)

    def assign(self, rb: RecordBatch, pb: PacketBatch) -> np.ndarray:
        """int64 receiver index per frame of the batch."""
        n = len(pb)
        if not n:
            return np.zeros(0, np.int64)
        self._reserve_peers(n)
        uk, key = np.empty((n, 4), np.uint64), np.empty((n, 4), np.uint64)
        tab, inv = np.empty(1 << (2 * n).bit_length(), np.int64), np.empty(n, np.int64)
        u = receiver_keys(pb.linktype, rb.caplen, pb.ip_version, np.ascontiguousarray(pb.dst), pb.if_gid, rb.buf,
                          rb.off, self._pk, self._pv, self._pu, self._pst, uk, tab, inv, key)
        # ids are given to new receivers in the byte order of their keys (as np.unique over the keys did)
        raw = [uk[j].tobytes() for j in range(u)]
        ids = np.empty(u, np.int64)
        for j in sorted(range(u), key=raw.__getitem__):
            ids[j] = self._id(raw[j])
        return ids[inv]

    def _reserve_peers(self, n: int) -> None:
        """Room for n more sources in the peer map, at most half full."""
        need = int(self._pst[0]) + n
        if 2 * need <= len(self._pu):
            return
        size = 1 << (2 * need).bit_length()
        live = np.flatnonzero(self._pu)
        pk, pv = np.ascontiguousarray(self._pk[live]), np.ascontiguousarray(self._pv[live])
        self._pk, self._pv, self._pu = np.zeros((size, 2), np.uint64), np.zeros(size, np.uint64), np.zeros(size, bool)
        peer_rehash(pk, pv, self._pk, self._pv, self._pu)

    def _id(self, key: bytes) -> int:
        i = self._index.get(key)
        if i is None:
            i = len(self.labels)
            self._index[key] = i
            self.labels.append(_label(key))
        return i


@njit(cache=True, entry=True, sig="u64[:, ::1], u64[::1], u64[:, ::1], u64[::1], b1[::1]")
def peer_rehash(K, V, PK, PV, PU):
    """Insert the entries (K, V) into the empty peer map (PK, PV, PU)."""
    for r in range(K.shape[0]):
        j = _peer_slot(PK, PU, K[r, 0], K[r, 1])
        PU[j] = True
        PK[j, 0] = K[r, 0]
        PK[j, 1] = K[r, 1]
        PV[j] = V[r]


def interface_labels(n: int) -> list[str]:
    """Receiver names when each capture interface is one receiver (no ``Receivers``: the engines' default
    receiver index is the frame's pcapng interface id), for interfaces 0 to n - 1: a single-interface capture
    has the one "capture interface"."""
    return ["capture interface"] + [f"capture interface {i}" for i in range(1, n)]


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
        return f"capturing host{f' ifindex {a}' if a else ''}{where}"
    if kind == K_GROUP:
        return "group " + ":".join(f"{(a >> s) & 0xFF:02x}" for s in range(40, -8, -8)) + where
    return f"non-IP frames{where}"
