"""The object helpers against the Rust SDK's tests (guest-sdk/src/object.rs)."""

from kubewasm import objects


def test_accessors_tolerate_missing_fields():
    empty = {}
    assert objects.name(empty) is None
    assert objects.namespace(empty) is None
    assert objects.labels(empty) == {}
    assert objects.annotation(empty, "a") is None
    assert objects.spec_str({"spec": {"who": 3}}, "who") is None
    assert objects.name({"metadata": "not an object"}) is None
    assert objects.kind(["not", "an", "object"]) is None


def test_builder_makes_a_full_object():
    obj = (
        objects.new("v1", "ConfigMap", "ns", "cm")
        .annotation("a", "1")
        .label("l", "2")
        .data({"k": "v"})
        .build()
    )
    assert obj == {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": "cm",
            "namespace": "ns",
            "annotations": {"a": "1"},
            "labels": {"l": "2"},
        },
        "data": {"k": "v"},
    }
    assert objects.annotations(obj) == {"a": "1"}
    assert objects.namespace(objects.new("v1", "Namespace", None, "n").build()) is None


def test_child_of_takes_the_parents_namespace():
    parent = {"metadata": {"name": "p", "namespace": "demo"}}
    child = objects.child_of(parent, "v1", "Pod", "c").spec({"containers": []}).build()
    assert child["metadata"] == {"name": "c", "namespace": "demo"}
    assert objects.spec(child) == {"containers": []}


def test_labels_keep_string_values_sorted():
    obj = {"metadata": {"labels": {"b": "2", "a": "1", "n": 3}}}
    assert list(objects.labels(obj).items()) == [("a", "1"), ("b", "2")]


def test_build_hands_out_independent_objects():
    builder = objects.new("v1", "ConfigMap", "ns", "cm").data({"k": "v"})
    first = builder.build()
    first["data"]["k"] = "changed"
    assert builder.build()["data"] == {"k": "v"}
