"""The request as the WIT record carries it, and the answer `host.respond` gets (compare
guest-sdk/src/wire.rs and guest-sdk/src/guest.rs)."""

import json
from types import SimpleNamespace

import kubewasm
import pytest
from kubewasm import ObjectRef, PermanentError, Request, Response, RetryableError, wire
from kubewasm.testing import FakeCluster, respond


def wit_request(parent):
    return SimpleNamespace(
        controller="ns/c",
        target=SimpleNamespace(api_version="v1", kind="ConfigMap", namespace="ns", name="cm"),
        parent=parent,
        children=['{"kind":"Pod"}'],
        previous=None,
        state="s",
        finalizing=True,
    )


def test_parses_each_document():
    request = wire.parse_request(wit_request('{"data":{"a":"b"}}'))
    assert request.controller == "ns/c"
    assert request.target == ObjectRef("v1", "ConfigMap", "ns", "cm")
    assert request.parent == {"data": {"a": "b"}}
    assert request.children == [{"kind": "Pod"}]
    assert request.previous is None
    assert request.state == "s"
    assert request.finalizing


def test_a_document_that_is_not_json_is_a_permanent_error():
    with pytest.raises(PermanentError) as err:
        wire.parse_request(wit_request("{not json"))
    assert err.value.message.startswith("invalid JSON")
    answer, error = wire.run(wit_request("{not json"), lambda r, c: Response(), FakeCluster())
    assert answer is None and error.message.startswith("invalid JSON") and not error.retryable


def test_documents_with_whitespace_or_extra_data():
    assert wire.parse_request(wit_request(' {"a": 1}\n')).parent == {"a": 1}
    for bad in ['{"a":1} {"b":2}', '{"a":1}x', "", " "]:
        with pytest.raises(PermanentError) as err:
            wire.parse_request(wit_request(bad))
        assert err.value.message.startswith("invalid JSON"), bad


def test_the_response_goes_out_as_one_document():
    request = Request.for_object(
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}}
    )
    answer, error = respond(lambda r, c: Response().set_state(r.target.name), request)
    assert error is None
    assert answer == '{"actions":[{"setState":"c"}]}'


def test_errors_the_guest_raises_are_its_answer():
    request = Request.gone(ObjectRef("v1", "Pod", "ns", "p"))

    def refused(request, cluster):
        raise RetryableError("not yet")

    def invalid(request, cluster):
        raise PermanentError("spec.size must be positive")

    assert respond(refused, request) == (None, RetryableError("not yet"))
    assert respond(invalid, request) == (None, PermanentError("spec.size must be positive"))


def test_a_read_the_cluster_refuses_is_the_reconciles_error():
    def reads(request, cluster):
        cluster.list("v1", "Pod")
        return Response()

    request = Request.gone(ObjectRef("v1", "Pod", "ns", "p"))
    _, error = respond(reads, request, FakeCluster().refusing_reads("no reads granted"))
    assert error == RetryableError("no reads granted")


def test_any_other_exception_is_reported_like_a_panic(capsys):
    def buggy(request, cluster):
        return request.parent["spec"]  # the parent is gone: TypeError

    _, error = respond(buggy, Request.gone(ObjectRef("v1", "Pod", "ns", "p")))
    assert error.retryable
    assert error.message == "reconcile raised TypeError: 'NoneType' object is not subscriptable"
    assert "Traceback" in capsys.readouterr().err


def test_a_reconcile_must_return_a_response():
    _, error = respond(lambda r, c: {"status": {}}, Request.gone(ObjectRef("v1", "Pod", "n", "p")))
    assert "reconcile returned dict, not a kubewasm.Response" in error.message


def test_the_request_crosses_as_json_text():
    parent = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "n"}}
    request = Request.for_object(parent).with_children([{"kind": "Pod"}]).with_state("x")
    seen = []

    def record(request, cluster):
        seen.append(request)
        return Response()

    respond(record, request)
    assert seen == [request]
    assert seen[0].parent is not parent, "a copy, as the component gets it"


def test_exactly_one_reconciler_is_exported(monkeypatch):
    monkeypatch.setattr(wire, "_registered", [])
    with pytest.raises(RuntimeError, match="found 0"):
        wire.exported()

    @kubewasm.reconciler
    def first(request, cluster):
        return Response()

    assert wire.exported() is first
    assert kubewasm.reconciler(first) is first, "decorating twice registers once"
    assert first(Request.gone(ObjectRef("v1", "Pod", None, "p")), FakeCluster()) == Response()

    @kubewasm.reconciler
    def second(request, cluster):
        return Response()

    with pytest.raises(RuntimeError, match="found 2"):
        wire.exported()
    with pytest.raises(TypeError):
        kubewasm.reconciler("not a function")


def test_json_of_the_request_round_trips():
    request = Request.for_object(
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "ü"}, "data": {"k": "ü"}}
    )
    seen = []
    respond(lambda r, c: seen.append(r) or Response(), request)
    assert json.dumps(seen[0].parent) == json.dumps(request.parent)


def test_out_of_memory_is_left_to_the_sandbox():
    def hungry(request, cluster):
        raise MemoryError

    with pytest.raises(MemoryError):
        respond(hungry, Request.gone(ObjectRef("v1", "Pod", "n", "p")))
