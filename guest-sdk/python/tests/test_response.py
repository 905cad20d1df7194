"""The response document: exactly what the Rust SDK writes and the host decodes (compare
runtime/src/sandbox/types.rs, `the_sdk_encodes_what_the_host_decodes`)."""

import datetime
import json

import pytest
from kubewasm import (
    Apply,
    DeleteAllOf,
    Event,
    EventType,
    ObjectRef,
    PermanentError,
    RequeueAfter,
    Response,
    SetState,
    SetStatus,
    objects,
)


def test_the_sdk_encodes_what_the_host_decodes():
    sent = (
        Response()
        .apply({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}})
        .delete(ObjectRef("v1", "Pod", "ns", "p"))
        .delete_all_of("v1", "Pod", None, "app=web")
        .set_status({"ready": True})
        .event(EventType.WARNING, "Stuck", "it is stuck")
        .requeue_after(datetime.timedelta(milliseconds=1500))
    )
    text = sent.to_json()
    assert '{"requeueAfterMillis":1500}' in text
    assert '"deleteAllOf":{"apiVersion":"v1","kind":"Pod","labelSelector":"app=web"}' in text
    assert '"event":{"type":"Warning","reason":"Stuck"' in text
    assert '"delete":{"apiVersion":"v1","kind":"Pod","namespace":"ns","name":"p"}' in text


def test_every_action_as_serde_writes_it():
    response = (
        Response()
        .delete(ObjectRef("v1", "Namespace", None, "n"))
        .delete_all_created_before("v1", "Pod", "demo", "app=x", "2026-11-23T12:00:06Z")
        .set_state("sha256:ab")
        .clear_state()
        .finalized()
        .requeue_after(2.5)
    )
    assert json.loads(response.to_json()) == {
        "actions": [
            {"delete": {"apiVersion": "v1", "kind": "Namespace", "name": "n"}},
            {
                "deleteAllOf": {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "namespace": "demo",
                    "labelSelector": "app=x",
                    "createdBefore": "2026-11-23T12:00:06Z",
                }
            },
            {"setState": "sha256:ab"},
            {"setState": None},
            {"finalized": True},
            {"requeueAfterMillis": 2500},
        ]
    }
    assert Response().to_json() == '{"actions":[]}'


def test_text_is_utf8_not_escaped():
    text = Response().set_status({"greeting": "Grüß dich, 世界"}).to_json()
    assert text == '{"actions":[{"setStatus":{"greeting":"Grüß dich, 世界"}}]}'


def test_what_json_cannot_write_is_a_permanent_error():
    circular = {}
    circular["self"] = circular
    for bad in [{"x": float("nan")}, {"x": {1, 2}}, {"x": "\udc80"}, circular]:
        with pytest.raises(PermanentError) as err:
            Response().set_status(bad).to_json()
        assert err.value.message.startswith("cannot write the response as JSON")


def test_requeue_delays():
    assert Response().requeue_after(datetime.timedelta(seconds=3)).actions == [RequeueAfter(3000)]
    assert Response().requeue_after(0.0015).actions == [RequeueAfter(2)]
    assert Response().requeue_after(4.35).actions == [RequeueAfter(4350)]
    with pytest.raises(ValueError):
        Response().requeue_after(-1)
    with pytest.raises(TypeError):
        Response().requeue_after("1s")


def test_builders_and_inspectors():
    pod = objects.new("v1", "Pod", "demo", "p")
    response = (
        Response()
        .apply(pod)
        .set_status({"a": 1})
        .set_status({"a": 2})
        .event("Normal", "Done", "all done")
        .set_state("one")
        .set_state("two")
    )
    assert response.applied() == [pod.build()]
    assert response.actions[0] == Apply(pod.build())
    assert response.status() == {"a": 2}
    assert response.events() == [(EventType.NORMAL, "Done", "all done")]
    assert response.actions[3] == Event(EventType.NORMAL, "Done", "all done")
    assert response.state() == SetState("two")
    assert Response().clear_state().state() == SetState(None)
    assert Response().state() is None
    assert not response.is_finalized() and Response().finalized().is_finalized()
    assert Response().is_empty() and not response.is_empty()
    assert SetStatus({"a": 1}) in response.actions
    with pytest.raises(ValueError):
        Response().event("Fatal", "X", "y")


def test_delete_all_of_is_one_action_type():
    assert Response().delete_all_of("v1", "Pod", "d", "a=b").actions == [
        DeleteAllOf("v1", "Pod", "d", "a=b", None)
    ]
