"""The fake cluster against the Rust SDK's tests (guest-sdk/src/testing.rs)."""

import pytest
from kubewasm import LogLevel, PermanentError, RetryableError, objects
from kubewasm.testing import FakeCluster, object_from_yaml, objects_from_yaml, request_from_yaml

PODS = """
apiVersion: v1
kind: Pod
metadata: {name: a, namespace: one, labels: {app: web}}
---
apiVersion: v1
kind: Pod
metadata: {name: b, namespace: one, labels: {app: db}}
---
apiVersion: v1
kind: Pod
metadata: {name: c, namespace: two, labels: {app: web}}
---
apiVersion: v1
kind: Namespace
metadata: {name: one}
"""


def names(found):
    return [objects.name(o) for o in found]


def test_list_filters_by_namespace_and_selector():
    cluster = FakeCluster.from_yaml(PODS)
    assert names(cluster.list("v1", "Pod", None, "app=web")) == ["a", "c"]
    assert names(cluster.list("v1", "Pod", "one")) == ["a", "b"]
    scoped = FakeCluster.from_yaml(PODS).with_default_namespace("two")
    assert names(scoped.list("v1", "Pod")) == ["c"]
    assert names(cluster.list("v1", "Pod", "one", "app notin (web)")) == ["b"]


def test_get_finds_namespaced_and_cluster_scoped():
    cluster = FakeCluster.from_yaml(PODS).with_default_namespace("one")
    assert cluster.get("v1", "Pod", "a") is not None
    assert cluster.get("v1", "Pod", "c") is None
    assert cluster.get("v1", "Pod", "c", namespace="two") is not None
    assert cluster.get("v1", "Namespace", "one") is not None
    assert cluster.get("apps/v1", "Pod", "a") is None


def test_bad_selector_names_and_refused_reads_are_errors():
    cluster = FakeCluster.from_yaml(PODS)
    with pytest.raises(PermanentError) as err:
        cluster.list("v1", "Pod", None, "app in")
    assert "invalid label selector" in err.value.message and not err.value.retryable
    with pytest.raises(PermanentError):
        cluster.get("v1", "Pod", "../a")
    with pytest.raises(PermanentError) as err:
        cluster.get("v1", "Namespace", "one", namespace="one")
    assert "cluster-scoped" in err.value.message
    with pytest.raises(RetryableError) as err:
        FakeCluster().refusing_reads("not granted").get("v1", "Pod", "a")
    assert err.value == RetryableError("not granted")


def test_get_takes_the_namespace_by_keyword_only():
    with pytest.raises(TypeError):
        FakeCluster.from_yaml(PODS).get("v1", "Pod", "one", "a")


def test_insert_replaces_same_object_and_logs_are_kept():
    cluster = FakeCluster.from_yaml(PODS)
    cluster.insert(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "a", "namespace": "one", "labels": {"app": "cache"}},
        }
    )
    assert len(cluster.objects) == 4
    assert len(cluster.list("v1", "Pod", "one", "app=cache")) == 1
    cluster.info("hello")
    cluster.warn("careful")
    assert cluster.logs == [(LogLevel.INFO, "hello"), (LogLevel.WARN, "careful")]


def test_reads_hand_out_copies():
    cluster = FakeCluster.from_yaml(PODS)
    cluster.get("v1", "Pod", "a", namespace="one")["metadata"]["labels"]["app"] = "changed"
    assert cluster.get("v1", "Pod", "a", namespace="one")["metadata"]["labels"] == {"app": "web"}


def test_request_from_yaml_takes_parent_then_children():
    request = request_from_yaml(PODS)
    assert request.target.name == "a"
    assert request.target.namespace == "one"
    assert request.controller == "test/controller"
    assert len(request.children) == 3
    assert len(request.children_of("v1", "Pod")) == 2


def test_yaml_is_read_as_yaml_1_2():
    obj = object_from_yaml(
        """
apiVersion: v1
kind: ConfigMap
metadata: {name: c, creationTimestamp: 2026-11-23T12:00:00Z}
data: {a: on, b: yes, c: "1", d: 017, e: 12:30, f: true, g: 1.5, h: ~}
"""
    )
    assert obj["metadata"]["creationTimestamp"] == "2026-11-23T12:00:00Z"
    assert obj["data"] == {
        "a": "on",
        "b": "yes",
        "c": "1",
        "d": 17,
        "e": "12:30",
        "f": True,
        "g": 1.5,
        "h": None,
    }


def test_malformed_fixtures_fail_like_assertions():
    with pytest.raises(AssertionError, match="exactly one YAML document, found 2"):
        object_from_yaml("a: 1\n---\nb: 2\n")
    with pytest.raises(AssertionError, match="not valid YAML"):
        objects_from_yaml("a: [")
    with pytest.raises(AssertionError, match="missing `metadata.name`"):
        request_from_yaml("apiVersion: v1\nkind: Pod\n")
    with pytest.raises(AssertionError, match="no documents"):
        request_from_yaml("")
