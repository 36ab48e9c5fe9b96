"""The normalized copy is the frame the kernel would have written without the BIG TCP encoding."""

from __future__ import annotations

import struct

from bigtcp_pcap.audit import normalize as nz
from bigtcp_pcap.decode.schema import BIGTCP_HBH_JUMBO, BIGTCP_V4_TOTLEN0, BIGTCP_V6_PLEN0, TUNNEL_NONE

from .conftest import (
    decode_packets,
    eth,
    ipv4_hdr,
    ipv6_hdr,
    tcp_hdr,
    udp_hdr,
    v4_tcp,
    v6_hbh_tcp,
    v6_plen0_tcp,
    v6_tcp,
)


def normalized(tmp_path, pkt):
    _, pb = decode_packets(tmp_path / "one.pcap", [pkt])
    f = nz.L3Fields.from_batch(pb, 0)
    return pb, f, nz.normalize_frame(pkt[0], pkt[1], f)


def test_hbh_jumbo_is_removed_and_payload_len_capped(tmp_path):
    payload = 80000
    pb, f, (new, wirelen) = normalized(tmp_path, v6_hbh_tcp(payload, snap=None))
    assert pb.bigtcp[0] == BIGTCP_HBH_JUMBO and f.ext_len == 8
    seg = tcp_hdr() + bytes(payload)
    assert new == eth(0x86DD) + ipv6_hdr(min(len(seg), 65535), 6) + seg
    assert wirelen == len(new) + 8  # the wire length (what len/less/greater test) is the frame's own


def test_truncated_frame_keeps_its_snaplen_cut(tmp_path):
    pkt = v6_hbh_tcp(80000, snap=96)
    _, _, (new, wirelen) = normalized(tmp_path, pkt)
    assert len(new) == 96 - 8 and wirelen == pkt[1]
    assert new[14 + 4:14 + 7] == struct.pack("!HB", 65535, 6)
    assert new[14 + 40:] == pkt[0][14 + 48:]


def test_ipv6_payload_len_0_without_hbh(tmp_path):
    pkt = v6_plen0_tcp(70000)
    pb, _, (new, wirelen) = normalized(tmp_path, pkt)
    assert pb.bigtcp[0] == BIGTCP_V6_PLEN0
    assert new == pkt[0][:18] + struct.pack("!H", 65535) + pkt[0][20:] and wirelen == pkt[1]


def test_ipv4_tot_len_0_restored(tmp_path):
    for payload in (1976, 80000):
        pkt = v4_tcp(payload, totlen0=True)
        pb, _, (new, wirelen) = normalized(tmp_path, pkt)
        assert pb.bigtcp[0] == BIGTCP_V4_TOTLEN0
        assert struct.unpack_from("!H", new, 16)[0] == min(20 + 20 + payload, 65535)
        assert new[:16] == pkt[0][:16] and new[18:] == pkt[0][18:] and wirelen == pkt[1]


def test_plain_frames_are_left_alone(tmp_path):
    for pkt in (v6_tcp(100), v4_tcp(100)):
        _, f, (new, wirelen) = normalized(tmp_path, pkt)
        assert not nz.needs_normalizing(f, pkt[0])
        assert (new, wirelen) == pkt


def test_fragment_is_not_normalized(tmp_path):
    frag = struct.pack("!BBHI", 6, 0, 0x1, 7)  # Fragment header, offset 0, M=1
    seg = tcp_hdr() + bytes(100)
    fr = eth(0x86DD) + ipv6_hdr(8 + len(seg), 44) + frag + seg
    _, f, out = normalized(tmp_path, (fr, len(fr)))
    assert nz.why_not(f, fr) == nz.SKIP_FRAGMENT and out == (fr, len(fr))



def vxlan(inner: bytes, outer_len: int | None = None, udp_len: int | None = None) -> bytes:
    """Ethernet/IPv4/UDP 4789/VXLAN around ``inner``; the outer length fields default to the true ones."""
    vx = struct.pack("!BBHI", 0x08, 0, 0, 0x100 << 8) + inner
    tot = 20 + 8 + len(vx) if outer_len is None else outer_len
    return eth(0x0800) + ipv4_hdr(tot, 17) + udp_hdr(50000, 4789, 8 + len(vx) if udp_len is None else udp_len) + vx


def test_tunnel_inner_hbh_removed_and_outer_lengths_follow(tmp_path):
    seg = tcp_hdr() + bytes(1000)
    inner = eth(0x86DD) + ipv6_hdr(8 + len(seg), 0) + bytes([6, 0, 0xC2, 4]) + struct.pack("!I", 8 + len(seg)) + seg
    outer = vxlan(inner)
    pb, f, (new, wirelen) = normalized(tmp_path, (outer, len(outer)))
    assert pb.tunnel[0] != TUNNEL_NONE and nz.why_not(f, outer) is None and nz.needs_normalizing(f, outer)
    plain_inner = eth(0x86DD) + ipv6_hdr(len(seg), 6) + seg
    assert new == vxlan(plain_inner) and wirelen == len(outer)


def test_tunnel_outer_length_0_gets_the_frame_length(tmp_path):
    inner = v4_tcp(80000, totlen0=True, snap=None)[0]
    outer = vxlan(inner, outer_len=0, udp_len=0)
    _, f, (new, _) = normalized(tmp_path, (outer[:200], len(outer)))
    assert nz.needs_normalizing(f, outer[:200])
    inner_fixed = inner[:16] + struct.pack("!H", 65535) + inner[18:]
    assert new == vxlan(inner_fixed, outer_len=65535, udp_len=65535)[:200]


def test_batch_normalization_equals_the_per_frame_rules():
    """normalize_batch (compiled) against why_not / needs_normalizing / normalize_frame, frame by frame, on every
    kernel capture."""
    from collections import Counter
    from pathlib import Path

    import numpy as np

    from bigtcp_pcap.audit import normalize as nz
    from bigtcp_pcap.capture import CaptureReader
    from bigtcp_pcap.decode import decode

    caps = sorted(p for p in (Path(__file__).resolve().parent.parent / "fixtures" / "kernel").rglob("*.pcap*")
                  if p.is_file())
    normalized = 0
    for cap in caps:
        for rb in CaptureReader(cap):
            pb, _ = decode(rb)
            c, w = pb.caplen.astype(np.int64), pb.wirelen.astype(np.int64)
            rows, nbuf, n_off, n_cap, n_wire, why = nz.normalize_batch(pb, rb.buf, rb.off, c, w, np.arange(len(pb)))
            ref_rows, ref_frames, ref_why = [], [], Counter()
            for i in range(len(pb)):
                f = nz.L3Fields.from_batch(pb, i)
                data = rb.buf[rb.off[i]:rb.off[i] + c[i]].tobytes()
                reason = nz.why_not(f, data)
                if reason is not None:
                    ref_why[reason] += 1
                elif nz.needs_normalizing(f, data):
                    ref_rows.append(i)
                    ref_frames.append(nz.normalize_frame(data, int(w[i]), f))
            assert rows.tolist() == ref_rows, cap.name
            assert why == ref_why, cap.name
            got = [(nbuf[o:o + n].tobytes(), int(wl)) for o, n, wl in zip(n_off, n_cap, n_wire)]
            assert got == ref_frames, cap.name
            normalized += len(rows)
    assert normalized > 500
