"""The component side (kubewasm/_guest.py) natively: the bindings componentize-py generates from
the project's WIT file, with the host's functions replaced by fakes. Checks that the SDK speaks
the generated API (records, enums, Ok/Err) as the component will."""

import importlib
import json
import pathlib
import re
import subprocess
import sys

import pytest
from kubewasm import PermanentError, Response, RetryableError
from kubewasm import wire as sdk_wire

WIT = pathlib.Path(__file__).resolve().parents[2] / "wit" / "kubewasm.wit"
COMPONENTIZE_PY = pathlib.Path(sys.executable).with_name("componentize-py")
# The world the guests are built against, as build.sh says.
BUILD_SH = pathlib.Path(__file__).resolve().parents[1] / "build.sh"
WORLD = re.search(r"^WORLD=(\S+)$", BUILD_SH.read_text(), re.MULTILINE).group(1)


@pytest.fixture(scope="module")
def bindings(tmp_path_factory):
    if not COMPONENTIZE_PY.exists():
        pytest.skip(
            "componentize-py is not beside this Python (run guest-sdk/python/build.sh test)"
        )
    out = tmp_path_factory.mktemp("bindings")
    subprocess.run(
        [str(COMPONENTIZE_PY), "-d", str(WIT), "-w", WORLD, "bindings", str(out)],
        check=True,
        capture_output=True,
    )
    sys.path.insert(0, str(out))
    try:
        yield out
    finally:
        sys.path.remove(str(out))
        for name in list(sys.modules):
            if name.split(".")[0] in ("wit_world", "componentize_py_types", "kubewasm._guest"):
                del sys.modules[name]


class FakeHost:
    """Stands in for the host's imports: answers reads from `objects`, records the rest."""

    def __init__(self, types, err):
        self.types, self.Err = types, err
        self.objects, self.logs, self.answers, self.asked = {}, [], [], []
        self.refuse = None

    def log(self, level, message):
        self.logs.append((level, message))

    def get(self, api_version, kind, namespace, name):
        self.asked.append(("get", api_version, kind, namespace, name))
        if self.refuse:
            raise self.Err(self.types.Error(message=self.refuse, retryable=True))
        found = self.objects.get(name)
        return None if found is None else json.dumps(found)

    def list(self, api_version, kind, namespace, label_selector):
        self.asked.append(("list", api_version, kind, namespace, label_selector))
        if self.refuse:
            raise self.Err(self.types.Error(message=self.refuse, retryable=False))
        return [json.dumps(o) for o in self.objects.values()]

    def respond(self, outcome):
        self.answers.append(outcome)


@pytest.fixture
def guest(bindings, monkeypatch):
    types = importlib.import_module("wit_world.imports.types")
    host = importlib.import_module("wit_world.imports.host")
    cpt = importlib.import_module("componentize_py_types")
    fake = FakeHost(types, cpt.Err)
    for name in ("log", "get", "list", "respond"):
        monkeypatch.setattr(host, name, getattr(fake, name))
    module = importlib.import_module("kubewasm._guest")
    monkeypatch.setattr(sdk_wire, "_registered", [])
    return module, types, cpt, fake


def request(types, parent):
    return types.Request(
        controller="demo/c",
        target=types.ObjectRef(api_version="v1", kind="ConfigMap", namespace="demo", name="cm"),
        parent=None if parent is None else json.dumps(parent),
        children=[],
        previous=None,
        state=None,
        finalizing=False,
    )


def test_the_answer_goes_to_respond_as_ok(guest):
    module, types, cpt, fake = guest
    parent = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm"}}
    fake.objects["other"] = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "o"}}

    def reconcile(request, cluster):
        cluster.info("reading")
        other = cluster.get("v1", "ConfigMap", "other", namespace="demo")
        listed = cluster.list("v1", "ConfigMap", None, "app=web")
        return Response().set_status({"other": other["metadata"]["name"], "n": len(listed)})

    sdk_wire.reconciler(reconcile)
    module.WitWorld().reconcile(request(types, parent))
    assert fake.answers == [cpt.Ok('{"actions":[{"setStatus":{"other":"o","n":1}}]}')]
    assert fake.logs == [(types.LogLevel.INFO, "reading")]
    assert fake.asked == [
        ("get", "v1", "ConfigMap", "demo", "other"),
        ("list", "v1", "ConfigMap", None, "app=web"),
    ]


def test_refused_reads_become_the_reconciles_error(guest):
    module, types, cpt, fake = guest
    fake.refuse = "ConfigMap (v1) is not declared"

    def reconcile(request, cluster):
        cluster.list("v1", "ConfigMap")
        return Response()

    sdk_wire.reconciler(reconcile)
    module.WitWorld().reconcile(request(types, None))
    assert fake.answers == [
        cpt.Err(types.Error(message="ConfigMap (v1) is not declared", retryable=False))
    ]
    cluster = module.HostCluster()
    with pytest.raises(RetryableError):
        cluster.get("v1", "ConfigMap", "x")


def test_invalid_reads_are_refused_before_the_host_is_asked(guest):
    module, types, cpt, fake = guest
    cluster = module.HostCluster()
    with pytest.raises(PermanentError, match="invalid object name"):
        cluster.get("v1", "ConfigMap", "../x")
    with pytest.raises(PermanentError, match="invalid namespace"):
        cluster.get("v1", "ConfigMap", "x", namespace="Demo")
    with pytest.raises(PermanentError, match="invalid label selector"):
        cluster.list("v1", "ConfigMap", None, "app in (")
    assert fake.asked == []


def test_every_log_level_maps_to_the_wit_enum(guest):
    module, types, cpt, fake = guest
    cluster = module.HostCluster()
    for log in (cluster.trace, cluster.debug, cluster.info, cluster.warn, cluster.error):
        log("x")
    assert [level for level, _ in fake.logs] == list(types.LogLevel)


def test_a_message_with_a_lone_surrogate_still_answers(guest):
    module, types, cpt, fake = guest

    def reconcile(request, cluster):
        raise PermanentError("bad \udc80 byte")

    sdk_wire.reconciler(reconcile)
    module.WitWorld().reconcile(request(types, None))
    (answer,) = fake.answers
    assert isinstance(answer, cpt.Err) and answer.value.message == "bad ? byte"


@pytest.mark.parametrize(
    "warm",
    [
        pytest.param(lambda module, world: module.warm_up(rounds=3), id="warm_up at build"),
        pytest.param(lambda module, world: world.prepare(), id="prepare ahead of a call"),
    ],
)
def test_warming_asks_the_host_nothing_and_calls_no_guest_function(guest, warm):
    module, types, cpt, fake = guest
    called = []

    def reconcile(request, cluster):
        called.append(request)
        return Response()

    sdk_wire.reconciler(reconcile)
    world = module.WitWorld()
    warm(module, world)
    assert called == []
    assert (fake.asked, fake.logs, fake.answers) == ([], [], [])
    assert sdk_wire._registered == [reconcile]
    # The guest's call after it is answered as before.
    world.reconcile(request(types, None))
    assert called and fake.answers == [cpt.Ok('{"actions":[]}')]
