"""The component side of the SDK: the ``reconcile`` export and the :class:`Cluster` over the
host imports. Imported only inside the component (by the entry module ``build.sh`` writes),
where componentize-py has generated ``wit_world`` from ``guest-sdk/wit/kubewasm.wit``; native
tests never import it.

Everything it needs is imported here, at the top: componentize-py runs the imports at build
time and snapshots the interpreter, and the sandbox gives the guest no files to import from
later.
"""

import json
import random
from typing import Any, Dict, List, Optional

import wit_world
from componentize_py_types import Err, Ok
from wit_world.imports import host
from wit_world.imports import types as wit

from . import query
from .cluster import Cluster, LogLevel
from .errors import Error, from_host
from .request import Request
from .response import Response
from .wire import _document, exported, run

_LEVELS = {
    LogLevel.TRACE: wit.LogLevel.TRACE,
    LogLevel.DEBUG: wit.LogLevel.DEBUG,
    LogLevel.INFO: wit.LogLevel.INFO,
    LogLevel.WARN: wit.LogLevel.WARN,
    LogLevel.ERROR: wit.LogLevel.ERROR,
}


def _refused(err: Err) -> Error:
    return from_host(err.value.message, err.value.retryable)


class HostCluster(Cluster):
    """The cluster as the host's imports offer it."""

    def get(
        self, api_version: str, kind: str, name: str, *, namespace: Optional[str] = None
    ) -> Optional[Dict[str, Any]]:
        # Refused here already, as FakeCluster and the host refuse them (permanently).
        query.validate_name(name)
        if namespace is not None:
            query.validate_namespace(namespace)
        try:
            found = host.get(api_version, kind, namespace, name)
        except Err as e:
            raise _refused(e) from None
        return _document(found)

    def list(
        self,
        api_version: str,
        kind: str,
        namespace: Optional[str] = None,
        label_selector: Optional[str] = None,
    ) -> List[Dict[str, Any]]:
        query.parse_selector(label_selector)
        if namespace is not None:
            query.validate_namespace(namespace)
        try:
            found = host.list(api_version, kind, namespace, label_selector)
        except Err as e:
            raise _refused(e) from None
        return [_document(doc) for doc in found]

    def log(self, level: LogLevel, message: str) -> None:
        host.log(_LEVELS[LogLevel(level)], message)


def warm_up(rounds: int = 8) -> None:
    """Run the SDK's own half of a reconcile a few times, at build time, before componentize-py
    snapshots the interpreter.

    Every instance starts from that snapshot and serves one reconcile, so every call would
    otherwise be the interpreter's first: each function's bytecode not yet specialized, the
    type caches empty. Run here, the SDK's part of a call (the request's records and JSON
    parsed, a response built and written) starts specialized in every instance. The guest's
    own function is not called: what a warm-up leaves in memory is the SDK's, never the
    guest's. ``random.seed`` is warmed too (componentize-py reseeds each instance on its first
    call, from the host's entropy: the snapshot's seed is never used).

    Run once more in each instance the host prepares ahead of its reconcile (``prepare``).
    """
    parent = {
        "apiVersion": "kubewasm.dev/v1",
        "kind": "WarmUp",
        "metadata": {"name": "warm-up", "namespace": "default", "labels": {"a": "b"}},
        "spec": {"replicas": 1, "ready": True, "names": ["a", "b"]},
    }
    child = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "warm-up", "namespace": "default"},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]},
    }
    text, child_text = json.dumps(parent), json.dumps(child)

    def reconcile(request: Request, cluster: Cluster) -> Response:
        found = request.parent["metadata"]["name"] + str(len(request.children_of("v1", "Pod")))
        return (
            Response()
            .apply(dict(child, metadata={"name": found, "labels": {"a": "%s" % found}}))
            .set_status({"pods": len(request.children), "who": found})
        )

    for _ in range(rounds):
        wire = wit.Request(
            controller="default/warm-up",
            target=wit.ObjectRef(
                api_version="kubewasm.dev/v1", kind="WarmUp", namespace="default", name="warm-up"
            ),
            parent=text,
            children=[child_text],
            previous=text,
            state=None,
            finalizing=False,
        )
        response, error = run(wire, reconcile, _Unreachable())
        if error is not None or response is None:
            raise RuntimeError(f"the SDK's warm-up failed: {error}")
        Ok(response)
        random.seed()


class _Unreachable(Cluster):
    """The cluster of the warm-up, which asks nothing of it (there is no host at build time)."""

    def get(self, api_version, kind, name, *, namespace=None):  # noqa: ANN001
        raise RuntimeError("the warm-up reads nothing")

    def list(self, api_version, kind, namespace=None, label_selector=None):  # noqa: ANN001
        raise RuntimeError("the warm-up reads nothing")

    def log(self, level, message):  # noqa: ANN001
        raise RuntimeError("the warm-up logs nothing")


class WitWorld(wit_world.WitWorld):
    """The exports of the ``kubewasm:controller`` world ``prepared-controller``: ``reconcile``,
    and ``prepare``, which the host calls on an instance it makes ahead of its reconcile."""

    def prepare(self) -> None:
        """Runs the SDK's own half of a reconcile once (``warm_up``), in the instance the host
        made ahead of its reconcile. Being an export call, it makes componentize-py set the
        instance up (the environment read from the host, ``random`` seeded from the host's
        entropy) here rather than in the reconcile; and the memory the SDK's code writes in a
        call (the interpreter's heap, its allocator's pools) is then written here first, so the
        reconcile does not pay for the first write to each page of the snapshot (copy-on-write
        faults) nor for the allocator's first work. Made ahead, the Python HelloWorld's reconcile
        took about a quarter of its time without it (BENCHMARKS.md). Nothing of the guest's runs,
        and the host is asked nothing."""
        warm_up(1)

    def reconcile(self, request: wit.Request) -> None:
        response, error = run(request, exported(), HostCluster())
        if error is None:
            host.respond(Ok(response))
        else:
            # A message is text for people: a lone surrogate must not stop the answer.
            message = error.message.encode("utf-8", "replace").decode("utf-8")
            host.respond(Err(wit.Error(message=message, retryable=error.retryable)))
