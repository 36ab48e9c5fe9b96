"""A small parser for pcap-filter(7) expressions: enough structure to rewrite them, never to evaluate them.

libpcap stays the only compiler and interpreter. This module splits an expression into its boolean structure
(``and``/``or``/``not``/parentheses) and its primitives, and classifies the primitives the filter audit knows
how to rewrite (``tcp``, ``udp port 53``, ``tcp src portrange 1-2``, ``ip6 proto 6``, relations such as
``tcp[tcpflags] & tcp-syn != 0`` or ``ip[2:2] > 1500``). Everything else is kept as the user wrote it.

Grammar facts it follows (pcap-filter(7) and libpcap's grammar.y / scanner.l):

* "Negation has the highest precedence. Alternation and concatenation have equal precedence and associate left
  to right" -- so ``a or b and c`` is ``(a or b) and c``; we re-emit with explicit parentheses.
* "If an identifier is given without a keyword, the most recent keyword is assumed" -- ``tcp port 80 or 443``
  is ``tcp port 80 or tcp port 443``; such bare identifiers are expanded when re-emitted.
* ``&&``/``||``/``!`` are ``and``/``or``/``not``; ``&``, ``|``, ``!=`` are arithmetic/relational.
* ``(`` opens arithmetic when its matching ``)`` is followed by an arithmetic or relational operator
  (``(tcp[13] & 2) != 0``), a boolean group otherwise.
* ``src or dst`` / ``src and dst`` are one direction qualifier.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ..errors import UsageError

PROTO_WORDS = frozenset(["ether", "fddi", "tr", "wlan", "ip", "ip6", "arp", "rarp", "decnet", "lat", "sca",
                         "moprc", "mopdl", "tcp", "udp", "sctp", "icmp", "icmp6", "igmp", "igrp", "pim",
                         "vrrp", "carp", "ah", "esp", "iso", "esis", "isis", "clnp", "stp", "ipx", "netbeui",
                         "atalk", "aarp", "link", "ppp", "slip", "radio", "l1", "l2", "iih", "lsp", "snp",
                         "csnp", "psnp"])
DIR_WORDS = frozenset(["src", "dst", "src or dst", "src and dst", "ra", "ta", "addr1", "addr2", "addr3",
                       "addr4"])
TYPE_WORDS = frozenset(["host", "net", "port", "portrange", "gateway", "proto", "protochain"])
RELOPS = frozenset(["=", "==", "!=", "<", ">", "<=", ">="])
# scanner.l returns these names as NUM tokens
NAMED_NUMBERS = {"icmptype": 0, "icmpcode": 1, "icmp6type": 0, "icmp6code": 1, "tcpflags": 13,
                 "tcp-fin": 0x01, "tcp-syn": 0x02, "tcp-rst": 0x04, "tcp-push": 0x08, "tcp-ack": 0x10,
                 "tcp-urg": 0x20, "tcp-ece": 0x40, "tcp-cwr": 0x80}

_WORD_OUT = re.compile(r"\\?[A-Za-z0-9_.:/][A-Za-z0-9_.:/\-]*")  # hosts, v4/v6/MAC addresses, 1-2 ranges
_WORD_IN = re.compile(r"[A-Za-z_][A-Za-z0-9_\-]*[A-Za-z0-9_]|[A-Za-z_]|0[xX][0-9a-fA-F]+|[0-9]+")


class ExprSyntaxError(UsageError, ValueError):
    """The expression has a shape this parser does not follow (libpcap may still accept it)."""


@dataclass(frozen=True)
class Tok:
    kind: str  # 'word', 'and', 'or', 'not', '(', ')', '[', ']', ':', 'op', 'relop'
    text: str
    start: int
    end: int


def tokenize(s: str) -> list[Tok]:
    """Split an expression into tokens the way libpcap's scanner does for valid expressions."""
    toks: list[Tok] = []
    i, n, bracket = 0, len(s), 0
    while i < n:
        c = s[i]
        if c.isspace():
            i += 1
            continue
        two = s[i:i + 2]
        if two in ("&&", "||"):
            toks.append(Tok("and" if two == "&&" else "or", two, i, i + 2))
            i += 2
        elif two in ("!=", "==", "<=", ">="):
            toks.append(Tok("relop", two, i, i + 2))
            i += 2
        elif two in ("<<", ">>"):
            toks.append(Tok("op", two, i, i + 2))
            i += 2
        elif c == "!":
            toks.append(Tok("not", c, i, i + 1))
            i += 1
        elif c in "=<>":
            toks.append(Tok("relop", c, i, i + 1))
            i += 1
        elif c in "()":
            toks.append(Tok(c, c, i, i + 1))
            i += 1
        elif c == "[":
            bracket += 1
            toks.append(Tok(c, c, i, i + 1))
            i += 1
        elif c == "]":
            bracket -= 1
            toks.append(Tok(c, c, i, i + 1))
            i += 1
        elif c == ":" and bracket > 0:
            toks.append(Tok(":", c, i, i + 1))
            i += 1
        elif c in "&|+*/%^-":
            toks.append(Tok("op", c, i, i + 1))
            i += 1
        else:
            m = (_WORD_IN if bracket > 0 else _WORD_OUT).match(s, i)
            if not m:
                raise ExprSyntaxError(f"unexpected character {c!r} at {i}")
            w = m.group(0)
            kind = {"and": "and", "or": "or", "not": "not"}.get(w, "word")
            toks.append(Tok(kind, w, i, m.end()))
            i = m.end()
    # 'src or dst' / 'src and dst' is one qualifier
    out: list[Tok] = []
    j = 0
    while j < len(toks):
        t = toks[j]
        if (t.kind == "word" and t.text in ("src", "dst") and j + 2 < len(toks) and toks[j + 1].kind in ("and", "or")
                and toks[j + 2].kind == "word" and toks[j + 2].text == ("dst" if t.text == "src" else "src")):
            out.append(Tok("word", f"src {toks[j + 1].kind} dst", t.start, toks[j + 2].end))
            j += 3
            continue
        out.append(t)
        j += 1
    return out


# --- AST ------------------------------------------------------------------------------------------------------
@dataclass
class Bool:
    op: str  # 'and' | 'or'
    left: Node
    right: Node


@dataclass
class Not:
    child: Node


@dataclass
class Group:
    child: Node


@dataclass
class Prim:
    """A qualifier primitive: ``[proto] [dir] [type] [id ...]`` (``tcp``, ``tcp dst port 80``, ``host x``...)."""

    text: str  # as written (for an inherited bare identifier: the identifier alone)
    proto: str | None
    dir: str | None
    kind: str | None
    ids: list[str]
    inherited: bool = False

    def explicit(self) -> str:
        """The primitive spelled with all its qualifiers (safe to emit anywhere)."""
        if not self.inherited:
            return self.text
        return " ".join(x for x in (self.proto, self.dir, self.kind, *self.ids) if x)


@dataclass
class Load:
    """``proto[index]`` or ``proto[index:size]`` inside a relation."""

    proto: str
    index: list[Item]
    size: int


@dataclass
class Rel:
    """A relation ``arith relop arith``; ``items`` are tokens and loads in order."""

    text: str
    items: list[Item] = field(default_factory=list)

    def loads(self) -> list[Load]:
        """Every load, nested ones included (outermost first)."""
        out: list[Load] = []

        def walk(items: list[Item]) -> None:
            for it in items:
                if isinstance(it, Load):
                    out.append(it)
                    walk(it.index)

        walk(self.items)
        return out


Item = Tok | Load
Node = Bool | Not | Group | Prim | Rel


def leaves(node: Node) -> list[Prim | Rel]:
    """The primitives and relations of a tree, left to right."""
    if isinstance(node, Bool):
        return leaves(node.left) + leaves(node.right)
    if isinstance(node, (Not, Group)):
        return leaves(node.child)
    return [node]


def relations(node: Node) -> list[Rel]:
    """The relations of a tree, left to right."""
    return [n for n in leaves(node) if isinstance(n, Rel)]


def primitives(node: Node) -> list[Prim]:
    """The qualifier primitives of a tree, left to right."""
    return [n for n in leaves(node) if isinstance(n, Prim)]


# --- parser ---------------------------------------------------------------------------------------------------
class _Parser:
    def __init__(self, s: str):
        self.s = s
        self.toks = tokenize(s)
        self.i = 0
        self.last_qual: tuple[str | None, str | None, str | None] | None = None

    def peek(self) -> Tok | None:
        return self.toks[self.i] if self.i < len(self.toks) else None

    def parse(self) -> Node:
        if not self.toks:
            raise ExprSyntaxError("empty expression")
        node = self.expr()
        if self.peek() is not None:
            raise ExprSyntaxError(f"unexpected {self.peek().text!r} at {self.peek().start}")
        return node

    def expr(self) -> Node:
        node = self.unary()
        while (t := self.peek()) is not None and t.kind in ("and", "or"):
            self.i += 1
            node = Bool(t.kind, node, self.unary())
        return node

    def unary(self) -> Node:
        t = self.peek()
        if t is None:
            raise ExprSyntaxError("expression ends too early")
        if t.kind == "not":
            self.i += 1
            return Not(self.unary())
        if t.kind == "(" and not self._paren_is_arith(self.i):
            self.i += 1
            inner = self.expr()
            if (c := self.peek()) is None or c.kind != ")":
                raise ExprSyntaxError("missing ')'")
            self.i += 1
            return Group(inner)
        return self.primitive()

    def _paren_is_arith(self, i: int) -> bool:
        depth = 0
        for j in range(i, len(self.toks)):
            k = self.toks[j].kind
            depth += (k == "(") - (k == ")")
            if depth == 0:
                nxt = self.toks[j + 1] if j + 1 < len(self.toks) else None
                return nxt is not None and nxt.kind in ("op", "relop")
        raise ExprSyntaxError("unbalanced '('")

    def primitive(self) -> Node:
        start = self.i
        depth = 0
        while (t := self.peek()) is not None:
            if depth == 0 and (t.kind in ("and", "or", "not") or t.kind == ")"):
                break
            depth += (t.kind == "(") - (t.kind == ")")
            self.i += 1
        toks = self.toks[start:self.i]
        if not toks:
            raise ExprSyntaxError(f"expected a primitive at {self.peek().start if self.peek() else len(self.s)}")
        text = self.s[toks[0].start:toks[-1].end]
        if any(t.kind == "relop" for t in toks):
            return Rel(text, _items(toks))
        if any(t.kind != "word" for t in toks):
            raise ExprSyntaxError(f"cannot classify {text!r}")
        return self._qualified(text, [t.text for t in toks])

    def _qualified(self, text: str, words: list[str]) -> Prim:
        if len(words) == 1 and words[0] not in PROTO_WORDS | DIR_WORDS | TYPE_WORDS and self.last_qual:
            proto, d, kind = self.last_qual
            return Prim(text, proto, d, kind, words, inherited=True)
        i, proto, d, kind = 0, None, None, None
        if i < len(words) and words[i] in PROTO_WORDS:
            proto, i = words[i], i + 1
        if i < len(words) and words[i] in DIR_WORDS:
            d, i = words[i], i + 1
        if i < len(words) and words[i] in TYPE_WORDS:
            kind, i = words[i], i + 1
        ids = words[i:]
        if d or kind:
            self.last_qual = (proto, d, kind)
        return Prim(text, proto, d, kind, ids)


def _items(toks: list[Tok]) -> list[Item]:
    """Group ``word [ ... ]`` runs into Load items, recursively."""
    out: list[Item] = []
    i = 0
    while i < len(toks):
        t = toks[i]
        if t.kind == "word" and i + 1 < len(toks) and toks[i + 1].kind == "[":
            depth, j = 0, i + 1
            while j < len(toks):
                depth += (toks[j].kind == "[") - (toks[j].kind == "]")
                if depth == 0:
                    break
                j += 1
            if j >= len(toks):
                raise ExprSyntaxError("unbalanced '['")
            inner = toks[i + 2:j]
            colon = [k for k, x in enumerate(inner) if x.kind == ":" and _bracket_depth(inner, k) == 0]
            size = 1
            if colon:
                size_toks = inner[colon[-1] + 1:]
                if len(size_toks) != 1 or not size_toks[0].text.isdigit():
                    raise ExprSyntaxError("load size must be a number")
                size = int(size_toks[0].text)
                inner = inner[:colon[-1]]
            out.append(Load(t.text, _items(inner), size))
            i = j + 1
            continue
        out.append(t)
        i += 1
    return out


def _bracket_depth(toks: list[Tok], k: int) -> int:
    return sum((t.kind == "[") - (t.kind == "]") for t in toks[:k])


def parse(expr: str) -> Node:
    """Parse a pcap filter expression into Bool/Not/Group/Prim/Rel nodes (raises ExprSyntaxError)."""
    return _Parser(expr).parse()


# --- emitting -------------------------------------------------------------------------------------------------
def render_items(items: list[Item], load_fn=None) -> str:
    """Arithmetic text for relation items; ``load_fn(load, render)`` may replace a load's text."""
    parts: list[str] = []
    prev_word = False
    for it in items:
        if isinstance(it, Load):
            txt = load_fn(it) if load_fn else render_load(it, load_fn)
            parts.append((" " if prev_word else "") + txt)
            prev_word = True
            continue
        if it.kind in ("op", "relop"):
            parts.append(f" {it.text} ")
            prev_word = False
        elif it.kind in ("(", ")", ":"):
            parts.append(it.text)
            prev_word = it.kind == ")"
        else:
            parts.append((" " if prev_word else "") + it.text)
            prev_word = True
    return "".join(parts).strip()


def render_load(ld: Load, load_fn=None) -> str:
    idx = render_items(ld.index, load_fn)
    return f"{ld.proto}[{idx}]" if ld.size == 1 else f"{ld.proto}[{idx}:{ld.size}]"


def const_value(items: list[Item]) -> int | None:
    """The value of a load index that is a single number or named constant, else None."""
    if len(items) != 1 or isinstance(items[0], Load):
        return None
    t = items[0].text
    if t in NAMED_NUMBERS:
        return NAMED_NUMBERS[t]
    try:
        return int(t, 0)
    except ValueError:
        return None


def emit(node: Node, prim=None, rel=None) -> str:
    """Expression text for a node tree: explicit parentheses for and/or; primitives as written (fully qualified
    when inherited) unless ``prim(Prim) -> str`` / ``rel(Rel) -> str`` give their text (the rewriter's hook)."""

    def walk(n: Node) -> str:
        if isinstance(n, Bool):
            return f"{sub(n.left)} {n.op} {sub(n.right)}"
        if isinstance(n, Not):
            return f"not {sub(n.child)}"
        if isinstance(n, Group):
            return f"({walk(n.child)})"
        if isinstance(n, Prim):
            return prim(n) if prim else n.explicit()
        return rel(n) if rel else n.text

    def sub(n: Node) -> str:
        return f"({walk(n)})" if isinstance(n, Bool) else walk(n)

    return walk(node)
