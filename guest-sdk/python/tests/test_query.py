"""The query rules against the Rust SDK's tests (guest-sdk/src/query.rs)."""

import pytest
from kubewasm import PermanentError, objects
from kubewasm.query import (
    ALL_NAMESPACES,
    CLUSTER,
    NAMESPACE,
    Query,
    QueryError,
    sort,
    validate_name,
    validate_namespace,
)


def pod(ns, name, app):
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": {"app": app}},
    }


def test_namespaced_kinds_default_to_the_given_namespace():
    q = Query("v1", "Pod", True, None, "web", "app=a")
    assert (q.scope, q.namespace) == (NAMESPACE, "web")
    assert q.matches(pod("web", "x", "a"))
    assert not q.matches(pod("other", "x", "a"))
    assert not q.matches(pod("web", "x", "b"))
    everywhere = Query("v1", "Pod", True)
    assert everywhere.scope == ALL_NAMESPACES
    assert everywhere.matches(pod("other", "x", "b"))
    assert not everywhere.matches({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"}})


def test_cluster_scoped_kinds_take_no_namespace():
    node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}}
    q = Query("v1", "Node", False, None, "web")
    assert q.scope == CLUSTER
    assert q.finds(node, "n1")
    with pytest.raises(QueryError) as err:
        Query("v1", "Node", False, "web")
    assert "Node (v1) is cluster-scoped" in str(err.value)


@pytest.mark.parametrize(
    "bad", ["", ".", "..", "x?fieldManager=y", "a/b", "../x", "a b", "a%2F", "x#y", "a\nb"]
)
def test_names_that_could_change_a_url_are_refused(bad):
    with pytest.raises(QueryError) as err:
        validate_name(bad)
    assert str(err.value).startswith("invalid object name")
    assert "\n" not in str(err.value)
    assert isinstance(err.value, PermanentError) and not err.value.retryable


def test_valid_names_and_namespaces():
    with pytest.raises(QueryError):
        validate_name("a" * 254)
    for good in ["your-name", "system:controller:x", "a.b_c", "a" * 253]:
        validate_name(good)
    for bad in ["", "-a", "a-", "A", "a.b", "a/b", "a" * 64]:
        with pytest.raises(QueryError):
            validate_namespace(bad)
    validate_namespace("team-a")
    with pytest.raises(QueryError):
        Query("v1", "Pod", True, "../x")


def test_bad_selectors_are_refused_with_one_message():
    with pytest.raises(QueryError) as err:
        Query("v1", "Pod", True, None, None, "app in (")
    assert str(err.value).startswith("invalid label selector `app in (`")


def test_sorted_by_namespace_then_name():
    found = [pod("b", "a", "x"), pod("a", "z", "x"), pod("a", "b", "x")]
    sort(found)
    assert [(objects.namespace(o), objects.name(o)) for o in found] == [
        ("a", "b"),
        ("a", "z"),
        ("b", "a"),
    ]
