"""Rewrite a capture filter so that it classifies BIG TCP / extension-header packets as the user means.

Each primitive is replaced by an expression that, on the *raw* packet, gives the verdict the original primitive
gives on the *normalized* packet (normalize.py); a boolean combination of such primitives is then right too.
The result is only a candidate: cbpf.py compiles it and re-runs it on every packet of the capture, and reports
it only when it agrees with the truth everywhere.

Rewrites (offsets relative to the IPv6 header; the HBH header is ``(ip6[41]+1)*8`` bytes, so L4 starts at
``48+ip6[41]*8`` when exactly one HBH header precedes it, which is what Linux BIG TCP emits):

* ``tcp`` / ``udp`` / ``sctp`` / ``icmp6`` / ``[ip6] proto N``  ->  ``X or (ip6[6]=0 and ip6[40]=N)``
* ``[tcp|udp|sctp] [src|dst] port P`` / ``portrange A-B``
  ->  ``X or (ip6[6]=0 and ip6[40]=N and (ip6[48+ip6[41]*8:2]=P or ip6[50+ip6[41]*8:2]=P))``
* ``tcp[e]`` / ``udp[e]`` relations (IPv4-only in libpcap, pcap-filter(7)) gain an IPv6 branch at
  ``ip6[40+e]`` (``mode='truth'``: nothing else changes) and an HBH branch at ``ip6[48+ip6[41]*8+e]``.
* ``icmp6[e]`` relations gain the HBH branch.
* ``ip[2:2]`` (IPv4 total length, 0 on BIG TCP/TSO) -> ``len - L2`` when the field is 0; ``ip6[4:2]`` (payload
  length, 0 on jumbograms and on the new BIG TCP format) likewise, minus the HBH header when there is one.
  L2 is the link header length of the linktype, so these suggestions depend on it.
* ``mode='protochain'``: protocol-only primitives become ``X or ip6 protochain N`` instead (walks any chain of
  extension headers, but is userland-only on Linux: the kernel rejects its backward jump).
* ``mode='ext'``: the HBH branches also take one routing or destination-options header (same length rule,
  ``(ip6[41]+1)*8``) and add one for a single AH header (``(ip6[41]+2)*4``: L4 at ``48+ip6[41]*4``). Tried
  when the HBH form does not verify; a chain of two or more extension headers has no fixed-offset form here.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass, field

from .expr import (
    ExprSyntaxError,
    Load,
    Prim,
    Rel,
    const_value,
    emit,
    parse,
    relations,
    render_items,
    render_load,
)

IPPROTO = {"tcp": 6, "udp": 17, "sctp": 132, "icmp6": 58}
PORT_PROTOS = {"tcp": (6,), "udp": (17,), "sctp": (132,), None: (6, 17, 132)}
# link header length by LINKTYPE (pcap-linktype(7)): EN10MB, NULL, LOOP, RAW (12, 14, 101), IPV4, IPV6, SLL, SLL2
LINK_HDR_LEN = {1: 14, 0: 4, 108: 4, 12: 0, 14: 0, 101: 0, 228: 0, 229: 0, 113: 16, 276: 20}
MODES = ("truth", "suggest", "protochain", "ext")
# the extension headers a fixed-offset branch can skip, by mode: (next-header test, length unit in octets)
EXT_BRANCHES = {"suggest": [("ip6[6]=0", 8)],
                "ext": [("(ip6[6]=0 or ip6[6]=43 or ip6[6]=60)", 8), ("ip6[6]=51", 4)]}


@dataclass
class Rewrite:
    """Outcome of a rewrite: the text, whether anything changed, and what could not be handled."""

    text: str
    changed: bool = False
    unsupported: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    uses_link_len: bool = False


def rewrite(expr: str, mode: str = "suggest", link_len: int | None = 14) -> Rewrite:
    """Rewrite ``expr`` (see module docstring). ``link_len`` is the link header length for length rewrites
    (None: unknown, and such relations are reported unsupported)."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}")
    try:
        tree = parse(expr)
    except ExprSyntaxError as e:
        return Rewrite(expr, unsupported=[f"could not parse the expression: {e}"])
    rw = _Rewriter(mode, link_len)
    text = emit(tree, rw.prim, rw.rel)
    return Rewrite(text if rw.changed else expr, rw.changed, rw.unsupported, rw.notes, rw.uses_link_len)


def has_l4_index(expr: str) -> bool:
    """True when a relation indexes only tcp[] or only udp[] (IPv4-only in libpcap), so the truth needs
    mode='truth'. A relation that also reads ip[] is IPv4-only by its own wording and is left alone."""
    try:
        tree = parse(expr)
    except ExprSyntaxError:
        return "tcp[" in expr.replace(" ", "") or "udp[" in expr.replace(" ", "")
    return any(len(p) == 1 and p <= {"tcp", "udp"} for p in ({ld.proto for ld in r.loads()} for r in relations(tree)))


def _port_number(name: str, protos: tuple[int, ...]) -> int | None:
    """A port id as libpcap resolves it (a number, or a service name; None if ambiguous or unknown)."""
    try:
        return int(name, 0)
    except ValueError:
        pass
    found = set()
    for p in protos:
        pname = {6: "tcp", 17: "udp", 132: "sctp"}[p]
        try:
            found.add(socket.getservbyname(name, pname))
        except OSError:
            continue
    return found.pop() if len(found) == 1 else None


def _l4_offset(extra: str | int, unit: int = 8) -> str:
    """``48+ip6[41]*8`` (``*4`` after AH) plus a constant or an expression (constant-folded when possible)."""
    if isinstance(extra, int):
        return f"{48 + extra}+ip6[41]*{unit}"
    return f"48+ip6[41]*{unit}+({extra})"


class _Rewriter:
    def __init__(self, mode: str, link_len: int | None):
        self.mode = mode
        self.link_len = link_len
        self.changed = False
        self.unsupported: list[str] = []
        self.notes: list[str] = []
        self.uses_link_len = False

    def _changed(self, text: str) -> str:
        self.changed = True
        return f"({text})"

    # -- qualifier primitives --
    def prim(self, p: Prim) -> str:
        orig = p.explicit()
        if self.mode == "truth":
            return orig
        nh = self._proto_only(p)
        if nh is not None:
            if self.mode == "protochain":
                return self._changed(f"{orig} or ip6 protochain {nh}")
            return self._changed(" or ".join([orig] + [f"({c} and ip6[40]={nh})" for c, _ in self.branches]))
        if p.kind in ("port", "portrange") and p.proto in PORT_PROTOS and len(p.ids) == 1:
            protos = PORT_PROTOS[p.proto]
            tests = [self._port_test(p, protos, unit) for _, unit in self.branches]
            if tests[0] is None:
                self.unsupported.append(f"{orig}: port name not resolvable to one number")
                return orig
            nh_test = " or ".join(f"ip6[40]={n}" for n in protos)
            nh_test = f"({nh_test})" if len(protos) > 1 else nh_test
            return self._changed(" or ".join([orig] + [f"({c} and {nh_test} and {t})"
                                                       for (c, _), t in zip(self.branches, tests)]))
        return orig

    @staticmethod
    def _proto_only(p: Prim) -> int | None:
        """Next-header number for a protocol-only primitive that misses HBH packets, else None."""
        if p.proto in IPPROTO and p.dir is None and p.kind is None and not p.ids:
            return IPPROTO[p.proto]
        if p.kind == "proto" and p.proto in (None, "ip6") and p.dir is None and len(p.ids) == 1:
            name = p.ids[0].lstrip("\\")
            if name in IPPROTO:
                return IPPROTO[name]
            try:
                return int(name, 0)
            except ValueError:
                return None
        return None

    @property
    def branches(self) -> list[tuple[str, int]]:
        """(next-header test, length unit) of the extension headers this mode's branches skip."""
        return EXT_BRANCHES.get(self.mode, EXT_BRANCHES["suggest"])

    @staticmethod
    def _port_test(p: Prim, protos: tuple[int, ...], unit: int = 8) -> str | None:
        src, dst = f"ip6[{_l4_offset(0, unit)}:2]", f"ip6[{_l4_offset(2, unit)}:2]"
        if p.kind == "port":
            port = _port_number(p.ids[0], protos)
            if port is None:
                return None
            s, d = f"{src}={port}", f"{dst}={port}"
        else:
            lo, sep, hi = p.ids[0].partition("-")
            a, b = _port_number(lo, protos), _port_number(hi, protos) if sep else None
            if a is None or (sep and b is None):
                return None
            b = a if not sep else b
            a, b = min(a, b), max(a, b)
            s, d = f"({src}>={a} and {src}<={b})", f"({dst}>={a} and {dst}<={b})"
        return {None: f"({s} or {d})", "src or dst": f"({s} or {d})", "src": s, "dst": d,
                "src and dst": f"({s} and {d})"}.get(p.dir)

    # -- relations --
    def rel(self, r: Rel) -> str:
        loads = r.loads()
        protos = {ld.proto for ld in loads}
        if not loads:
            return r.text
        if protos <= {"tcp", "udp"} and len(protos) == 1:
            return self._l4_index(r, protos.pop())
        if self.mode == "truth":
            return r.text
        if protos == {"icmp6"}:
            return self._changed(" or ".join([r.text] + [
                f"({c} and ip6[40]=58 and {self._render(r, {'icmp6': self._ext_load(unit)})})"
                for c, unit in self.branches]))
        if "ip" in protos and any(self._is(ld, "ip", 2, 2) for ld in loads):
            return self._length_field(r, "ip", 2)
        if protos == {"ip6"} and any(self._is(ld, "ip6", 4, 2) for ld in loads):
            return self._length_field(r, "ip6", 4)
        if "ip6" in protos:
            self.notes.append(f"{r.text}: reads IPv6 header bytes at fixed offsets; extension headers shift them, "
                              "and the audit's truth removes them (differences may be what you intend)")
        return r.text

    @staticmethod
    def _is(ld: Load, proto: str, index: int, size: int) -> bool:
        return ld.proto == proto and const_value(ld.index) == index and ld.size == size

    def _render(self, r: Rel, mapping: dict) -> str:
        def fn(ld: Load) -> str:
            f = mapping.get(ld.proto)
            return f(ld, fn) if f else render_load(ld, fn)

        return render_items(r.items, fn)

    @staticmethod
    def _v6_load(base: int):
        """tcp[e:s] -> ip6[base+e:s] (on a packet whose L4 header is at a fixed offset)."""

        def f(ld: Load, fn) -> str:
            k = const_value(ld.index)
            idx = str(base + k) if k is not None else f"{base}+({render_items(ld.index, fn)})"
            return f"ip6[{idx}]" if ld.size == 1 else f"ip6[{idx}:{ld.size}]"

        return f

    @staticmethod
    def _ext_load(unit: int):
        """proto[e:s] -> ip6[L4+e:s] behind one extension header of ``unit``-octet length units."""

        def f(ld: Load, fn) -> str:
            k = const_value(ld.index)
            idx = _l4_offset(k if k is not None else render_items(ld.index, fn), unit)
            return f"ip6[{idx}]" if ld.size == 1 else f"ip6[{idx}:{ld.size}]"

        return f

    def _l4_index(self, r: Rel, proto: str) -> str:
        nh = IPPROTO[proto]
        plain = self._render(r, {proto: self._v6_load(40)})
        parts = [r.text, f"(ip6[6]={nh} and {plain})"]
        if self.mode != "truth":
            parts += [f"({c} and ip6[40]={nh} and {self._render(r, {proto: self._ext_load(unit)})})"
                      for c, unit in self.branches]
        return self._changed(" or ".join(parts))

    def _length_field(self, r: Rel, proto: str, index: int) -> str:
        """A relation reading the IPv4 total length / IPv6 payload length, which BIG TCP sets to 0."""
        if self.link_len is None:
            self.unsupported.append(f"{r.text}: the link header length differs between linktypes")
            return r.text
        self.uses_link_len = True
        field_ = f"{proto}[{index}:2]"
        if proto == "ip":
            true_len = {"ip": lambda ld, fn: f"(len - {self.link_len})" if self._is(ld, "ip", 2, 2)
                        else render_load(ld, fn)}
            zero = f"({field_}=0 and {self._render(r, true_len)})"
            return self._changed(f"({field_}!=0 and {r.text}) or {zero}")
        plain = {"ip6": lambda ld, fn: f"(len - {self.link_len + 40})" if self._is(ld, "ip6", 4, 2)
                 else render_load(ld, fn)}
        hbh = {"ip6": lambda ld, fn: f"(len - {self.link_len + 48} - ip6[41]*8)" if self._is(ld, "ip6", 4, 2)
               else render_load(ld, fn)}
        return self._changed(f"({field_}!=0 and {r.text}) or ({field_}=0 and ip6[6]!=0 and "
                             f"{self._render(r, plain)}) or ({field_}=0 and ip6[6]=0 and {self._render(r, hbh)})")
