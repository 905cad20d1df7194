"""Text for messages, written the way the Rust SDK writes it, so that a Python guest and a Rust
guest say the same thing about the same input (and tests can compare them)."""

import unicodedata

# Characters Rust's `char::is_printable` refuses, approximately: control, format, private-use,
# surrogate and unassigned code points, and the line and paragraph separators.
_UNPRINTABLE = frozenset({"Cc", "Cf", "Co", "Cs", "Cn", "Zl", "Zp"})

_SHORT = {"\0": "\\0", "\t": "\\t", "\r": "\\r", "\n": "\\n", "\\": "\\\\"}


def _escape_char(c: str, single_quote: bool) -> str:
    if c in _SHORT:
        return _SHORT[c]
    if c == '"' or (single_quote and c == "'"):
        return "\\" + c
    if unicodedata.category(c) in _UNPRINTABLE:
        return "\\u{%x}" % ord(c)
    return c


def rust_debug(s: str) -> str:
    """`s` quoted as Rust's `{:?}` writes a string: `"a\\nb"`."""
    return '"' + "".join(_escape_char(c, single_quote=False) for c in s) + '"'


def printable(s: str) -> str:
    """Control characters escaped (Rust's `char::escape_debug`), so that a hostile name cannot
    forge log lines."""
    return "".join(_escape_char(c, single_quote=True) for c in s)


def truncate(s: str, max_bytes: int) -> str:
    """At most the first `max_bytes` bytes of `s` in UTF-8, cut at a character boundary."""
    encoded = s.encode("utf-8", "surrogatepass")
    if len(encoded) <= max_bytes:
        return s
    return encoded[:max_bytes].decode("utf-8", "ignore")


def utf8_len(s: str) -> int:
    """Length of `s` in UTF-8 bytes (Rust's `str::len`)."""
    return len(s.encode("utf-8", "surrogatepass"))
