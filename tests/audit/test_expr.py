"""The expression parser keeps the meaning: what it emits compiles (libpcap) to the very same program."""

from __future__ import annotations

import pytest

from bigtcp_pcap.audit.expr import Bool, Group, Not, Prim, Rel, emit, parse
from bigtcp_pcap.audit.libpcap import CompiledFilter

EXPRESSIONS = [
    "tcp", "tcp port 5201", "not tcp", "ip6 and tcp", "tcp or udp and port 53", "tcp port 80 or 443",
    "src or dst port 53", "tcp src and dst port 5201", "(tcp[13] & 2) != 0", "tcp[tcpflags] & (tcp-syn|tcp-fin) != 0",
    "ip[2:2] - ((ip[0]&0xf)<<2) - ((tcp[12]&0xf0)>>2) != 0", "not tcp and !udp", "tcp && ip6 || udp",
    "host 10.0.0.1 and (port 22 or port 80)", "ip6 host fd00:b1::1", "ether host 02:00:00:00:00:01",
    "tcp portrange 5000-5300", "net 10.0.0.0/8", "ip6 protochain 6", "len > 100", "greater 1000", "vlan and tcp",
    "ip6[48+ip6[41]*8:2]=5201", "icmp6[icmp6type] = icmp6-echo", "udp and not port 53", "((tcp))",
    "not (tcp port 80 or udp port 53) and ip6", "ip proto \\tcp", "tcp[((tcp[12:1] & 0xf0) >> 2):4] = 0x47455420",
]


@pytest.mark.parametrize("expr", EXPRESSIONS)
def test_emitted_expression_compiles_to_the_same_program(expr):
    assert CompiledFilter(emit(parse(expr)), 1).instructions == CompiledFilter(expr, 1).instructions


def test_and_or_have_equal_precedence_left_to_right():
    """pcap-filter(7): 'Alternation and concatenation have equal precedence and associate left to right'."""
    t = parse("tcp or udp and port 53")
    assert isinstance(t, Bool) and t.op == "and" and isinstance(t.left, Bool) and t.left.op == "or"


def test_not_binds_tightest():
    t = parse("not tcp and udp")
    assert isinstance(t, Bool) and isinstance(t.left, Not)


def test_bare_identifier_inherits_the_last_qualifiers():
    t = parse("tcp port 80 or 443")
    assert isinstance(t.right, Prim) and t.right.inherited and t.right.explicit() == "tcp port 443"


def test_arithmetic_parenthesis_is_a_relation_not_a_group():
    assert isinstance(parse("(tcp[13] & 2) != 0"), Rel)
    assert isinstance(parse("(tcp)"), Group)


def test_nested_loads_are_found():
    (rel,) = [parse("tcp[((tcp[12:1] & 0xf0) >> 2):4] = 0x47455420")]
    assert [(ld.proto, ld.size) for ld in rel.loads()] == [("tcp", 4), ("tcp", 1)]


def test_src_or_dst_is_one_qualifier():
    p = parse("src or dst port 53")
    assert isinstance(p, Prim) and p.dir == "src or dst" and p.kind == "port" and p.ids == ["53"]
