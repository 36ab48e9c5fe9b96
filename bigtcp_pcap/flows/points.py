"""Capture points: where in the capturing host a packet was seen.

A capture can hold the same packet more than once: ``tcpdump -i any`` on a bridge, a router or a container host
records a forwarded segment on the interface it came in on and again on the one it left by (Linux cooked v2
headers name the interface: its ifindex), and a pcapng file merged from several captures holds each capture's
copy under its own interface, and a tunnel endpoint's ``-i any`` capture holds each packet encapsulated on the
underlay and bare on the tunnel device. Counted as one flow, every copy would be a retransmission and every byte twice.
So the flow table keys each flow direction by its capture point too (``flows/table.py`` ``point``: the pcapng
interface, the cooked v2 ifindex, and whether the host received or sent it): the copies are separate rows
(flows.parquet ``if_id``, ``ifindex``, ``direction``), each
with its own sequence bookkeeping, GRO rebuild and ACK evidence, and the summary lists the points.
"""

from __future__ import annotations

from collections import Counter

import numpy as np


def flows_per_point(if_id: np.ndarray, ifindex: np.ndarray) -> Counter:
    """Flow rows per capture point ``(if_id, ifindex)`` (ifindex 0: none named) of a batch of flow rows."""
    key = (np.asarray(if_id, np.uint64) << np.uint64(32)) | np.asarray(ifindex, np.uint64)
    u, n = np.unique(key, return_counts=True)
    return Counter({(int(k >> 32), int(k & 0xFFFFFFFF)): int(c) for k, c in zip(u.tolist(), n.tolist())})


def point_suffix(if_id, ifindex, direction) -> str:
    """A flow name's capture point: `` @interface K`` (a pcapng interface other than the first), `` @ifindex N``
    (a Linux cooked v2 header's), `` (received)`` / `` (sent)`` (a Linux cooked header's packet type); each part
    only where known (None, 0, NaN or pandas' NA: not)."""
    def known(v):
        try:
            return int(v) != 0
        except (TypeError, ValueError):  # None, pandas' NA (TypeError), a float NaN (ValueError): not known
            return False

    at = "".join(f" @{name} {int(v)}" for name, v in (("interface", if_id), ("ifindex", ifindex)) if known(v))
    return at + ({1: " (received)", 2: " (sent)"}.get(int(direction), "") if known(direction) else "")


def capture_points(points: Counter) -> list[dict]:
    """The summary's ``capture_points``: one entry per point in (if_id, ifindex) order, with its flow rows."""
    return [{"if_id": i, "ifindex": x or None, "flows": n} for (i, x), n in sorted(points.items())]


def points_text(points: list[dict]) -> str | None:
    """The summary line for more than one capture point (None for one)."""
    if len(points) < 2:
        return None
    names = []
    several_interfaces = any(q["if_id"] for q in points)
    for p in points[:8]:
        where = [f"interface {p['if_id']}"] if several_interfaces else []
        if p.get("ifindex"):
            where.append(f"ifindex {p['ifindex']}")
        names.append(f"{' '.join(where)} ({p['flows']:,} flows)")
    more = f" and {len(points) - 8} more" if len(points) > 8 else ""
    return (f"{len(points)}: " + ", ".join(names) + more + ". A flow row per point: a connection seen at two "
            "points (a forwarded packet on its way in and out, a tunnelled one on the underlay and on the tunnel "
            "device, one on a stacked device such as macvlan or VLAN and on its lower device) is two rows, and its "
            "copies are not retransmissions")
