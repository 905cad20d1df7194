"""HelloWorld's sync() against fixtures, natively: the Rust guest's tests
(guests/hello-world/tests/reconcile.rs) on the Rust guest's fixtures, so both guests are held to
the same behaviour."""

import json
import pathlib

from hello_world import sync
from kubewasm import Apply, ObjectRef, Request, SetStatus
from kubewasm.testing import FakeCluster, request_from_yaml, respond

FIXTURES = pathlib.Path(__file__).resolve().parents[2] / "hello-world" / "tests" / "fixtures"


def fixture(name):
    return (FIXTURES / name).read_text()


def run(name):
    return sync(request_from_yaml(fixture(name)), FakeCluster())


def command(pod):
    return pod["spec"]["containers"][0]["command"]


def test_seed_input_gives_a_pod_greeting_your_name():
    response = run("your-name.yaml")
    expected = json.loads(fixture("your-name-pod.json"))
    assert response.actions == [Apply(expected), SetStatus({"pods": 0})]


def test_who_defaults_to_world():
    for name in ["no-who.yaml", "empty-who.yaml"]:
        pod = run(name).applied()[0]
        assert command(pod) == ["echo", "Hello, World!"]
        assert pod["metadata"]["namespace"] == "demo"


def test_status_counts_observed_child_pods():
    response = run("with-children.yaml")
    assert response.status() == {"pods": 1}
    pod = response.applied()[0]
    assert pod["metadata"]["name"] == "greeter"
    assert command(pod) == ["echo", "Hello, Ada!"]


def test_gone_parent_needs_nothing():
    request = Request.gone(ObjectRef("example.com/v1", "HelloWorld", "demo", "greeter"))
    response = sync(request, FakeCluster())
    assert response.is_empty(), response


def test_same_input_same_actions():
    assert run("with-children.yaml") == run("with-children.yaml")


def test_the_answer_on_the_wire():
    """What the component hands the host for the tutorial's input."""
    answer, error = respond(sync, request_from_yaml(fixture("your-name.yaml")))
    assert error is None
    assert json.loads(answer) == {
        "actions": [
            {"apply": json.loads(fixture("your-name-pod.json"))},
            {"setStatus": {"pods": 0}},
        ]
    }
