"""The selector port against the Rust SDK's tests (guest-sdk/src/selector/mod.rs)."""

import pytest
from kubewasm import PermanentError
from kubewasm.selector import (
    MAX_SELECTOR_BYTES,
    MAX_SELECTOR_TERMS,
    Operator,
    Selector,
    SelectorError,
)


def check(selector, labels):
    return Selector.parse(selector).matches(dict(labels))


def test_equality_forms():
    assert check("a=b", {"a": "b"})
    assert check("a==b", {"a": "b"})
    assert check(" a = b ", {"a": "b"})
    assert not check("a=b", {"a": "c"})
    assert not check("a=b", {})
    assert check("a!=b", {"a": "c"})
    assert check("a!=b", {})
    assert not check("a!=b", {"a": "b"})


def test_existence_forms():
    assert check("a", {"a": ""})
    assert not check("a", {"b": "x"})
    assert check("!a", {"b": "x"})
    assert not check("!a", {"a": "x"})


def test_set_forms():
    assert check("a in (x,y)", {"a": "y"})
    assert check("a in (x, y)", {"a": "x"})
    assert not check("a in (x,y)", {"a": "z"})
    assert not check("a in (x,y)", {})
    assert check("a notin (x)", {"a": "y"})
    assert check("a notin (x)", {})
    assert not check("a notin (x)", {"a": "x"})


def test_comparison_forms():
    assert check("a>1", {"a": "2"})
    assert not check("a>1", {"a": "1"})
    assert not check("a>1", {"a": "x"})
    assert check("a<1", {"a": "0"})
    with pytest.raises(SelectorError):
        Selector.parse("a>x")


def test_conjunction_and_everything():
    sel = "app=web,tier in (front,back), !legacy,env"
    assert check(sel, {"app": "web", "tier": "back", "env": "p"})
    assert not check(sel, {"app": "web", "tier": "back"})
    assert not check(sel, {"app": "web", "tier": "back", "env": "p", "legacy": "1"})
    assert check("", {})
    assert check("  ", {"a": "b"})
    assert Selector.parse("").is_empty()


def test_empty_values():
    assert check("a=", {"a": ""})
    assert not check("a=", {"a": "x"})
    assert check("a=,b", {"a": "", "b": "1"})
    assert check("a in (x,)", {"a": ""})


def test_prefixed_keys():
    assert check("app.kubernetes.io/name=web", {"app.kubernetes.io/name": "web"})
    for bad in ["Bad_Prefix/name=x", "/name", "example.com/"]:
        with pytest.raises(SelectorError):
            Selector.parse(bad)


@pytest.mark.parametrize(
    "selector, needle",
    [
        ("a in x", 'expected "(" after "in"'),
        ("a in ()", "at least one value"),
        ("a in (x", 'expected "," or ")"'),
        ("a b", "expected an operator"),
        ("a=b c", 'expected "," or the end'),
        ("=b", "expected a label key"),
        ("a,", "expected a label key"),
        ("a=-b", "must start and end"),
        ("a=b=c", 'expected "," or the end'),
        ("a=b*", "may contain only"),
        ("!a=b", 'expected "," or the end'),
        ("a==(x)", "expected a label value"),
    ],
)
def test_invalid_selectors_say_why(selector, needle):
    with pytest.raises(SelectorError) as err:
        Selector.parse(selector)
    assert needle in str(err.value)
    assert f'"{selector}"' in str(err.value)
    assert isinstance(err.value, PermanentError) and not err.value.retryable


def test_long_values_say_the_limit():
    with pytest.raises(SelectorError) as err:
        Selector.parse("a=" + "x" * 64)
    assert "63" in err.value.reason


def test_error_positions_are_utf8_byte_offsets_as_in_rust():
    with pytest.raises(SelectorError) as err:
        Selector.parse("é=b c")
    # "é" is not a valid key: refused at its own position, 0.
    assert err.value.position == 0
    with pytest.raises(SelectorError) as err:
        Selector.parse("a=b,\u00e9\u00e9 c")
    assert err.value.position == 4
    with pytest.raises(SelectorError) as err:
        Selector.parse("a in (\u00e9")
    assert err.value.position == 6


def test_display_round_trips():
    for selector in ["a=b,c!=d,e in (x,y),f notin (z),g,!h,i>3,j<4", "a="]:
        parsed = Selector.parse(selector)
        assert str(parsed) == selector
        assert Selector.parse(str(parsed)) == parsed
    assert str(Selector.parse("a==b")) == "a=b"


def test_matches_objects():
    sel = Selector.parse("app=web")
    assert sel.matches_object({"metadata": {"name": "p", "labels": {"app": "web"}}})
    bare = {"metadata": {"name": "p"}}
    assert not sel.matches_object(bare)
    assert Selector.parse("!app").matches_object(bare)
    # Values that are not strings count as absent, as in Rust.
    assert not sel.matches_object({"metadata": {"labels": {"app": 7}}})


def test_narrows_needs_a_label_that_must_exist():
    for selector in ["a=b", "a==b", "a", "a in (b)", "a>1", "a<1", "!a,b=c", "a!=b,c"]:
        assert Selector.parse(selector).narrows(), selector
    for selector in ["", "!nonexistent", "a!=b", "a notin (b)", "!a,b!=c,d notin (e)"]:
        assert not Selector.parse(selector).narrows(), selector


def test_long_selectors_are_refused_before_parsing():
    at_limit = "a in (" + "x," * ((MAX_SELECTOR_BYTES - 7) // 2) + ")"
    assert len(at_limit) <= MAX_SELECTOR_BYTES
    assert len(Selector.parse(at_limit).requirements[0].values) == 2
    too_long = "a=" + "é" * MAX_SELECTOR_BYTES
    with pytest.raises(SelectorError) as err:
        Selector.parse(too_long)
    assert "more than the limit of 4096" in err.value.reason
    assert len(str(err.value)) < 300, "the error echoes the whole selector"


def test_terms_are_bounded():
    at_limit = ",".join(["a"] * MAX_SELECTOR_TERMS)
    assert len(Selector.parse(at_limit).requirements) == MAX_SELECTOR_TERMS
    with pytest.raises(SelectorError) as err:
        Selector.parse(at_limit + ",b")
    assert "more than 64 requirements" in err.value.reason


def test_duplicate_values_are_dropped_in_order():
    values = [f"v{i}" for i in range(600)]
    selector = f"a in ({','.join(values)},{','.join(values[:100])})"
    assert len(selector) <= MAX_SELECTOR_BYTES
    assert list(Selector.parse(selector).requirements[0].values) == values


def test_requirement_accessors():
    req = Selector.parse("a in (x,y,x)").requirements[0]
    assert req.key == "a"
    assert req.operator is Operator.IN
    assert req.values == ("x", "y")


def test_integers_parse_as_rust_i64():
    assert check("a>-5", {"a": "+3"})
    with pytest.raises(SelectorError):
        Selector.parse("a>9223372036854775808")
    # Python's int() would take these; Rust's i64 parser does not.
    assert not check("a>1", {"a": "1_000"})
    assert not check("a>1", {"a": " 5"})
