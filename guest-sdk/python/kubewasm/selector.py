"""Kubernetes label selectors: parse the string form (``app=web,tier!=db,env in (a,b)``) and
match it against an object's labels.

A port of the Rust SDK's ``selector`` module, which follows the API server's ``labels.Parse``:
the same grammar, the same limits, the same error messages (positions are byte offsets in
UTF-8, as there), so that a guest's fake cluster, the runtime's shared cache and the API server
agree on which objects a selector picks.

=================  ===========================================================
form               matches when
=================  ===========================================================
``a=b``, ``a==b``  label ``a`` is present with value ``b``
``a!=b``           label ``a`` is absent or has another value
``a``              label ``a`` is present
``!a``             label ``a`` is absent
``a in (x,y)``     label ``a`` is present with value ``x`` or ``y``
``a notin (x,y)``  label ``a`` is absent or has neither value
``a>1``, ``a<1``   label ``a`` is present, an integer, and greater/less than it
=================  ===========================================================

>>> selector = Selector.parse("app=web, env in (prod,staging), !legacy")
>>> selector.matches({"app": "web", "env": "prod"})
True
>>> str(selector)
'app=web,env in (prod,staging),!legacy'
"""

import enum
import re
from typing import List, Mapping, Optional, Tuple

from ._text import rust_debug, truncate, utf8_len
from .errors import PermanentError

#: The longest selector accepted, in bytes.
MAX_SELECTOR_BYTES = 4096

#: The most requirements (comma-separated terms) a selector may have.
MAX_SELECTOR_TERMS = 64

_I64_MIN, _I64_MAX = -(2**63), 2**63 - 1
_INTEGER = re.compile(r"[+-]?[0-9]+\Z", re.ASCII)


def _parse_i64(text: str) -> Optional[int]:
    """`text` as Rust's `str::parse::<i64>` reads it, or `None`."""
    if not _INTEGER.match(text):
        return None
    value = int(text)
    return value if _I64_MIN <= value <= _I64_MAX else None


class Operator(enum.Enum):
    """How one requirement compares a label with its values."""

    EQUALS = "="
    NOT_EQUALS = "!="
    IN = "in"
    NOT_IN = "notin"
    EXISTS = "exists"
    DOES_NOT_EXIST = "!"
    GREATER_THAN = ">"
    LESS_THAN = "<"


_NEEDS_LABEL = {
    Operator.EQUALS,
    Operator.IN,
    Operator.EXISTS,
    Operator.GREATER_THAN,
    Operator.LESS_THAN,
}


class Requirement:
    """One condition of a selector: a label key, an operator and the values it compares with."""

    __slots__ = ("key", "operator", "values")

    def __init__(self, key: str, operator: Operator, values: Tuple[str, ...] = ()):
        self.key = key
        self.operator = operator
        self.values = tuple(values)

    def needs_label(self) -> bool:
        """Whether only objects that carry this requirement's label can satisfy it."""
        return self.operator in _NEEDS_LABEL

    def matches(self, labels: Optional[Mapping[str, object]]) -> bool:
        """Whether `labels` (a mapping; values that are not strings count as absent) satisfy
        this requirement."""
        value = _label(labels, self.key)
        op = self.operator
        if op in (Operator.EQUALS, Operator.IN):
            return value is not None and value in self.values
        if op in (Operator.NOT_EQUALS, Operator.NOT_IN):
            return not (value is not None and value in self.values)
        if op is Operator.EXISTS:
            return value is not None
        if op is Operator.DOES_NOT_EXIST:
            return value is None
        have = _parse_i64(value) if value is not None else None
        bound = _parse_i64(self.values[0]) if self.values else None
        if have is None or bound is None:
            return False
        return have > bound if op is Operator.GREATER_THAN else have < bound

    def __str__(self) -> str:
        key, op, values = self.key, self.operator, self.values
        if op is Operator.IN:
            return f"{key} in ({','.join(values)})"
        if op is Operator.NOT_IN:
            return f"{key} notin ({','.join(values)})"
        if op is Operator.EXISTS:
            return key
        if op is Operator.DOES_NOT_EXIST:
            return f"!{key}"
        return f"{key}{op.value}{values[0]}"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Requirement):
            return NotImplemented
        return (self.key, self.operator, self.values) == (other.key, other.operator, other.values)

    def __hash__(self) -> int:
        return hash((self.key, self.operator, self.values))

    def __repr__(self) -> str:
        return f"Requirement({self.key!r}, {self.operator}, {self.values!r})"


def _label(labels: Optional[Mapping[str, object]], key: str) -> Optional[str]:
    if not isinstance(labels, Mapping):
        return None
    value = labels.get(key)
    return value if isinstance(value, str) else None


class SelectorError(PermanentError):
    """A selector that could not be parsed: what was expected and where (a byte offset)."""

    def __init__(self, selector: str, position: int, reason: str):
        super().__init__(
            f"invalid label selector {rust_debug(selector)}: {reason} (at position {position})"
        )
        #: The selector (cut when it was too long to parse at all).
        self.selector = selector
        #: Byte offset in the selector where the problem was found.
        self.position = position
        #: What is wrong, without the selector itself.
        self.reason = reason


class Selector:
    """A parsed label selector: every requirement must hold. The empty selector matches
    everything."""

    __slots__ = ("requirements",)

    def __init__(self, requirements: Tuple[Requirement, ...] = ()):
        #: The requirements, in the order written.
        self.requirements = tuple(requirements)

    @classmethod
    def parse(cls, selector: str) -> "Selector":
        """Parse the string form of a label selector, as ``kubectl -l`` and the API server
        take it. Raises :class:`SelectorError` (a :class:`~kubewasm.PermanentError`)."""
        length = utf8_len(selector)
        if length > MAX_SELECTOR_BYTES:
            raise SelectorError(
                truncate(selector, 64) + "…",
                MAX_SELECTOR_BYTES,
                f"the selector is {length} bytes, more than the limit of {MAX_SELECTOR_BYTES}; "
                "select on fewer or shorter labels",
            )
        return _Parser(selector).parse()

    def is_empty(self) -> bool:
        """Whether the selector has no requirements (and so matches everything)."""
        return not self.requirements

    def narrows(self) -> bool:
        """Whether at least one requirement needs its label to exist: a selector that does not
        (``""``, ``!legacy``, ``app!=x``) matches nearly every object; use it for reads, not
        for deleting."""
        return any(r.needs_label() for r in self.requirements)

    def matches(self, labels: Optional[Mapping[str, object]]) -> bool:
        """Whether `labels` satisfy every requirement (`None`: no labels)."""
        return all(r.matches(labels) for r in self.requirements)

    def matches_object(self, obj: object) -> bool:
        """Whether a Kubernetes object (a dict) has ``metadata.labels`` that satisfy the
        selector."""
        metadata = obj.get("metadata") if isinstance(obj, dict) else None
        labels = metadata.get("labels") if isinstance(metadata, dict) else None
        return self.matches(labels if isinstance(labels, dict) else None)

    def __str__(self) -> str:
        """The canonical string form, e.g. ``app=web,env in (a,b)``; it parses back to the same
        selector."""
        return ",".join(str(r) for r in self.requirements)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Selector):
            return NotImplemented
        return self.requirements == other.requirements

    def __hash__(self) -> int:
        return hash(self.requirements)

    def __repr__(self) -> str:
        return f"Selector.parse({str(self)!r})"


# Tokens: ("ident", text) or one of these names.
_BANG, _EQ, _DEQ, _NEQ, _GT, _LT = "!", "=", "==", "!=", ">", "<"
_IN, _NOTIN, _COMMA, _OPEN, _CLOSE, _END = "in", "notin", ",", "(", ")", "end"
_IDENT = "ident"
_SPECIAL = frozenset("!=,()<>")

# Rust's `char::is_whitespace`: the Unicode White_Space property.
_WHITESPACE = frozenset(
    "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008"
    "\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
)


def _describe(token: Tuple[str, str]) -> str:
    kind, text = token
    if kind == _IDENT:
        return rust_debug(text)
    if kind == _END:
        return "the end of the selector"
    return f'"{kind}"'


def _lex(text: str) -> List[Tuple[int, Tuple[str, str]]]:
    tokens = []
    pos = 0  # byte offset of text[i]
    i, n = 0, len(text)

    def width(c: str) -> int:
        return len(c.encode("utf-8", "surrogatepass"))

    while i < n:
        c = text[i]
        if c in _WHITESPACE:
            pos += width(c)
            i += 1
            continue
        start = pos
        next_is_eq = i + 1 < n and text[i + 1] == "="
        if c in "!=" and next_is_eq:
            token = (_NEQ if c == "!" else _DEQ, "")
            i, pos = i + 2, pos + 2
        elif c in _SPECIAL:
            token = (c, "")
            i, pos = i + 1, pos + 1
        else:
            j = i
            while j < n and text[j] not in _WHITESPACE and (j == i or text[j] not in _SPECIAL):
                pos += width(text[j])
                j += 1
            ident = text[i:j]
            i = j
            if ident in (_IN, _NOTIN):
                token = (ident, "")
            else:
                token = (_IDENT, ident)
        tokens.append((start, token))
    tokens.append((pos, (_END, "")))
    return tokens


class _Parser:
    def __init__(self, text: str):
        self.text = text
        self.tokens = _lex(text)
        self.next = 0

    def error(self, position: int, reason: str) -> SelectorError:
        return SelectorError(self.text, position, reason)

    def peek(self) -> Tuple[int, Tuple[str, str]]:
        return self.tokens[min(self.next, len(self.tokens) - 1)]

    def advance(self) -> Tuple[int, Tuple[str, str]]:
        token = self.peek()
        self.next += 1
        return token

    def parse(self) -> Selector:
        requirements: List[Requirement] = []
        if self.peek()[1][0] == _END:
            return Selector(())
        while True:
            if len(requirements) == MAX_SELECTOR_TERMS:
                raise self.error(
                    self.peek()[0],
                    f"more than {MAX_SELECTOR_TERMS} requirements; select on fewer labels",
                )
            requirements.append(self.requirement())
            pos, token = self.advance()
            if token[0] == _END:
                return Selector(tuple(requirements))
            if token[0] != _COMMA:
                raise self.error(pos, f'expected "," or the end, found {_describe(token)}')

    def requirement(self) -> Requirement:
        negated = self.peek()[1][0] == _BANG
        if negated:
            self.advance()
        key = self.key()
        if negated:
            return Requirement(key, Operator.DOES_NOT_EXIST)
        pos, token = self.peek()
        kind = token[0]
        if kind in (_COMMA, _END):
            return Requirement(key, Operator.EXISTS)
        operators = {
            _EQ: Operator.EQUALS,
            _DEQ: Operator.EQUALS,
            _NEQ: Operator.NOT_EQUALS,
            _IN: Operator.IN,
            _NOTIN: Operator.NOT_IN,
            _GT: Operator.GREATER_THAN,
            _LT: Operator.LESS_THAN,
        }
        if kind not in operators:
            raise self.error(
                pos,
                'expected an operator (=, ==, !=, in, notin, >, <), "," or the end after key '
                f"{rust_debug(key)}, found {_describe(token)}",
            )
        operator = operators[kind]
        self.advance()
        if operator in (Operator.IN, Operator.NOT_IN):
            values = self.value_set(operator)
        elif operator in (Operator.GREATER_THAN, Operator.LESS_THAN):
            values = [self.integer()]
        else:
            values = [self.single_value()]
        return Requirement(key, operator, tuple(values))

    def key(self) -> str:
        pos, token = self.advance()
        if token[0] != _IDENT:
            raise self.error(pos, f"expected a label key, found {_describe(token)}")
        why = _validate_key(token[1])
        if why:
            raise self.error(pos, why)
        return token[1]

    def single_value(self) -> str:
        pos, token = self.peek()
        if token[0] in (_COMMA, _END):
            return ""
        if token[0] == _IDENT:
            self.advance()
            why = _validate_value(token[1])
            if why:
                raise self.error(pos, why)
            return token[1]
        raise self.error(pos, f"expected a label value, found {_describe(token)}")

    def integer(self) -> str:
        pos, token = self.advance()
        if token[0] == _IDENT:
            if _parse_i64(token[1]) is None:
                raise self.error(
                    pos,
                    f'expected an integer after ">" or "<", found {rust_debug(token[1])}',
                )
            return token[1]
        raise self.error(pos, f"expected an integer, found {_describe(token)}")

    def value_set(self, operator: Operator) -> List[str]:
        name = "in" if operator is Operator.IN else "notin"
        pos, token = self.advance()
        if token[0] != _OPEN:
            raise self.error(pos, f'expected "(" after "{name}", found {_describe(token)}')
        pos, token = self.peek()
        if token[0] == _CLOSE:
            raise self.error(pos, f'"{name}" needs at least one value in its parentheses')
        values: List[str] = []
        seen = set()
        while True:
            pos, token = self.peek()
            value = ""
            if token[0] == _IDENT:
                self.advance()
                why = _validate_value(token[1])
                if why:
                    raise self.error(pos, why)
                value = token[1]
            if value not in seen:
                seen.add(value)
                values.append(value)
            pos, token = self.advance()
            if token[0] == _CLOSE:
                return values
            if token[0] != _COMMA:
                raise self.error(
                    pos,
                    f'expected "," or ")" in the values of "{name}", found {_describe(token)}',
                )


_DNS_LABEL_CHARS = re.compile(r"[a-z0-9-]*\Z", re.ASCII)
_NAME_CHARS = re.compile(r"[A-Za-z0-9._-]*\Z", re.ASCII)


def _validate_key(key: str) -> Optional[str]:
    """Why `key` is not a label key (an optional DNS-subdomain prefix and ``/``, then a name of
    at most 63 characters), or `None`."""
    prefix, slash, name = key.partition("/")
    if not slash:
        prefix, name = None, key
    if prefix is not None:
        valid_prefix = (
            prefix != ""
            and utf8_len(prefix) <= 253
            and all(
                part != ""
                and _DNS_LABEL_CHARS.match(part)
                and not part.startswith("-")
                and not part.endswith("-")
                for part in prefix.split(".")
            )
        )
        if not valid_prefix:
            return (
                f'invalid label key {rust_debug(key)}: the prefix before "/" must be a DNS '
                'subdomain (lowercase letters, digits, "-" and ".")'
            )
    if name == "":
        return f"invalid label key {rust_debug(key)}: the name part is empty"
    why = _check_name(name)
    return f"invalid label key {rust_debug(key)}: {why}" if why else None


def _validate_value(value: str) -> Optional[str]:
    if value == "":
        return None
    why = _check_name(value)
    return f"invalid label value {rust_debug(value)}: {why}" if why else None


def _check_name(name: str) -> Optional[str]:
    if utf8_len(name) > 63:
        return "it must be at most 63 characters"
    if not _NAME_CHARS.match(name):
        return 'it may contain only letters, digits, "-", "_" and "."'
    if not (name[0].isascii() and name[0].isalnum() and name[-1].isascii() and name[-1].isalnum()):
        return "it must start and end with a letter or digit"
    return None
