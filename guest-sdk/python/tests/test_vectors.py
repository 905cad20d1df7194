"""The shared test vectors (guest-sdk/vectors/): label selectors, reads' queries and response
documents, asserted here for the Python SDK and by guest-sdk/tests/vectors.rs for the Rust
SDK, so the two answer alike. A response must be the same document as the Rust SDK writes
(the same JSON; the order of an object's keys is the dict's, which JSON does not fix)."""

import datetime
import json
import pathlib

import pytest
from kubewasm import ObjectRef, Response
from kubewasm.query import Query, QueryError
from kubewasm.selector import Selector, SelectorError

VECTORS = pathlib.Path(__file__).resolve().parents[2] / "vectors"


def cases(name):
    return json.loads((VECTORS / f"{name}.json").read_text(encoding="utf-8"))["cases"]


@pytest.mark.parametrize("case", cases("selectors"), ids=lambda c: repr(c["selector"]))
def test_selectors(case):
    if case.get("invalid"):
        with pytest.raises(SelectorError):
            Selector.parse(case["selector"])
        return
    selector = Selector.parse(case["selector"])
    for labels, matches in case["match"]:
        assert selector.matches(labels) == matches, (case["selector"], labels)


@pytest.mark.parametrize("case", cases("queries"))
def test_queries(case):
    args = (
        case["apiVersion"],
        case["kind"],
        case["namespaced"],
        case["namespace"],
        case["defaultNamespace"],
        case["labelSelector"],
    )
    if case.get("invalid"):
        with pytest.raises((QueryError, SelectorError)):
            Query(*args)
        return
    query = Query(*args)
    for obj, matches in case["objects"]:
        assert query.matches(obj) == matches, obj


def build(actions):
    """The response `actions` (in the wire form) built with the SDK's builder."""
    response = Response()
    for action in actions:
        ((name, body),) = action.items()
        if name == "apply":
            response.apply(body)
        elif name == "delete":
            response.delete(
                ObjectRef(body["apiVersion"], body["kind"], body.get("namespace"), body["name"])
            )
        elif name == "deleteAllOf":
            args = (body["apiVersion"], body["kind"], body.get("namespace"), body["labelSelector"])
            if "createdBefore" in body:
                response.delete_all_created_before(*args, body["createdBefore"])
            else:
                response.delete_all_of(*args)
        elif name == "setStatus":
            response.set_status(body)
        elif name == "event":
            response.event(body["type"], body["reason"], body["message"])
        elif name == "requeueAfterMillis":
            response.requeue_after(datetime.timedelta(milliseconds=body))
        elif name == "setState":
            if body is None:
                response.clear_state()
            else:
                response.set_state(body)
        elif name == "finalized":
            response.finalized()
        else:
            raise AssertionError(f"no builder for action {name}")
    return response


@pytest.mark.parametrize("case", cases("responses"))
def test_responses(case):
    written = build(case["actions"]).to_json()
    # The same actions in the same order, each with the same fields: what the host decodes.
    assert json.loads(written) == json.loads(case["document"])
