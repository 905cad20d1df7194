"""A native test harness: a fake cluster loaded from YAML and requests built from fixtures, so a
guest's ``reconcile`` runs in plain ``pytest`` without wasm or a cluster.

>>> from kubewasm import Response
>>> from kubewasm.testing import FakeCluster, request_from_yaml
>>> def reconcile(request, cluster):
...     pods = cluster.list("v1", "Pod", request.target.namespace, "app=web")
...     return Response().set_status({"pods": len(pods)})
>>> cluster = FakeCluster.from_yaml('''
... apiVersion: v1
... kind: Pod
... metadata: {name: web-1, namespace: demo, labels: {app: web}}
... ''')
>>> request = request_from_yaml('''
... apiVersion: example.com/v1
... kind: Site
... metadata: {name: site, namespace: demo}
... ''')
>>> reconcile(request, cluster).status()
{'pods': 1}

The YAML is read as YAML 1.2 (as the Rust SDK's serde_yaml and the API server read it):
``on``, ``yes`` and unquoted dates stay strings. It needs PyYAML (installed by ``build.sh``);
the rest of this module does not. The helpers raise ``AssertionError`` with a clear message on
malformed fixtures, like assertions do.
"""

import copy
import re
from types import SimpleNamespace
from typing import Any, Dict, List, Optional, Tuple

from . import objects
from .cluster import Cluster, LogLevel
from .errors import Error, RetryableError
from .query import Query, sort, validate_name
from .request import ObjectRef, Request
from .wire import Reconcile, run

_loader = None


def _yaml_loader():
    """A PyYAML loader with YAML 1.2 core-schema scalars (made once)."""
    global _loader
    if _loader is not None:
        return _loader
    import yaml

    class Loader(yaml.SafeLoader):
        pass

    dropped = {
        "tag:yaml.org,2002:bool",
        "tag:yaml.org,2002:int",
        "tag:yaml.org,2002:float",
        "tag:yaml.org,2002:timestamp",
    }
    Loader.yaml_implicit_resolvers = {
        first: [(tag, rx) for tag, rx in resolvers if tag not in dropped]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }
    Loader.add_implicit_resolver(
        "tag:yaml.org,2002:bool",
        re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
        list("tTfF"),
    )
    Loader.add_implicit_resolver(
        "tag:yaml.org,2002:int",
        re.compile(r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$"),
        list("-+0123456789"),
    )
    Loader.add_implicit_resolver(
        "tag:yaml.org,2002:float",
        re.compile(
            r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
            r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
        ),
        list("-+.0123456789"),
    )

    def construct_int(loader, node):
        text = loader.construct_scalar(node)
        if text.startswith("0o"):
            return int(text[2:], 8)
        if text.startswith("0x"):
            return int(text[2:], 16)
        return int(text, 10)

    Loader.add_constructor("tag:yaml.org,2002:int", construct_int)
    _loader = Loader
    return Loader


def objects_from_yaml(text: str) -> List[Dict[str, Any]]:
    """Every document of a (multi-document) YAML string; empty documents are skipped."""
    import yaml

    try:
        docs = list(yaml.load_all(text, Loader=_yaml_loader()))
    except yaml.YAMLError as e:
        raise AssertionError(f"fixture is not valid YAML: {e}") from None
    return [doc for doc in docs if doc is not None]


def object_from_yaml(text: str) -> Dict[str, Any]:
    """The single object of a YAML string."""
    docs = objects_from_yaml(text)
    assert len(docs) == 1, f"expected exactly one YAML document, found {len(docs)}"
    return docs[0]


def request_from_yaml(text: str) -> Request:
    """A request from a YAML fixture: the first document is the parent (the target), every
    further document an observed child."""
    docs = objects_from_yaml(text)
    assert docs, "the request fixture has no documents"
    try:
        request = Request.for_object(docs[0])
    except Error as e:
        raise AssertionError(f"the request fixture's first document: {e}") from None
    return request.with_children(docs[1:]).with_controller("test/controller")


class FakeCluster(Cluster):
    """An in-memory cluster: objects loaded from YAML, reads answered through the same
    :class:`~kubewasm.query.Query` rules as the runtime's (scope, namespace, names, selector,
    order), log lines kept for assertions. Reads hand out copies, as the host does: a guest
    that changes what it read changes nothing here."""

    def __init__(self) -> None:
        self._objects: List[Dict[str, Any]] = []
        self._default_namespace: Optional[str] = None
        self._refuse_reads: Optional[str] = None
        self._logs: List[Tuple[LogLevel, str]] = []

    @classmethod
    def from_yaml(cls, text: str) -> "FakeCluster":
        """A cluster holding every object of a (multi-document) YAML string."""
        return cls().with_yaml(text)

    def with_yaml(self, text: str) -> "FakeCluster":
        """Add every object of a (multi-document) YAML string."""
        for obj in objects_from_yaml(text):
            self.insert(obj)
        return self

    def insert(self, obj: Dict[str, Any]) -> None:
        """Add one object, replacing one with the same apiVersion, kind, namespace and name."""
        try:
            key = ObjectRef.of(obj)
        except Error as e:
            raise AssertionError(str(e)) from None
        self._objects = [o for o in self._objects if not key.refers_to(o)]
        self._objects.append(obj)

    def with_default_namespace(self, namespace: str) -> "FakeCluster":
        """Reads with ``namespace=None`` look in this namespace (as the host uses the target's
        namespace). Without it, such reads see every namespace."""
        self._default_namespace = namespace
        return self

    def refusing_reads(self, message: str) -> "FakeCluster":
        """Refuse every read with this (retryable) message, as a host does for kinds not
        granted."""
        self._refuse_reads = message
        return self

    @property
    def objects(self) -> List[Dict[str, Any]]:
        """The objects held, in insertion order."""
        return list(self._objects)

    @property
    def logs(self) -> List[Tuple[LogLevel, str]]:
        """The log lines written so far."""
        return list(self._logs)

    def _check_reads(self) -> None:
        if self._refuse_reads is not None:
            raise RetryableError(self._refuse_reads)

    def _namespaced(self, api_version: str, kind: str) -> bool:
        """Whether a kind lives in namespaces, as far as the objects held tell: a kind with no
        objects, or with namespaced ones, is taken as namespaced."""
        for obj in self._objects:
            if objects.api_version(obj) == api_version and objects.kind(obj) == kind:
                return objects.namespace(obj) is not None
        return True

    def _query(self, api_version, kind, namespace, label_selector) -> Query:
        return Query(
            api_version,
            kind,
            self._namespaced(api_version, kind),
            namespace,
            self._default_namespace,
            label_selector,
        )

    def get(
        self, api_version: str, kind: str, name: str, *, namespace: Optional[str] = None
    ) -> Optional[Dict[str, Any]]:
        self._check_reads()
        validate_name(name)
        query = self._query(api_version, kind, namespace, None)
        for obj in self._objects:
            if query.finds(obj, name):
                return copy.deepcopy(obj)
        return None

    def list(
        self,
        api_version: str,
        kind: str,
        namespace: Optional[str] = None,
        label_selector: Optional[str] = None,
    ) -> List[Dict[str, Any]]:
        self._check_reads()
        query = self._query(api_version, kind, namespace, label_selector)
        found = [copy.deepcopy(obj) for obj in self._objects if query.matches(obj)]
        sort(found)
        return found

    def log(self, level: LogLevel, message: str) -> None:
        self._logs.append((LogLevel(level), message))


def to_wire(request: Request) -> SimpleNamespace:
    """`request` as the WIT ``request`` record carries it: each document as JSON text."""
    import json

    def text(doc):
        return None if doc is None else json.dumps(doc)

    return SimpleNamespace(
        controller=request.controller,
        target=SimpleNamespace(
            api_version=request.target.api_version,
            kind=request.target.kind,
            namespace=request.target.namespace,
            name=request.target.name,
        ),
        parent=text(request.parent),
        children=[text(child) for child in request.children],
        previous=text(request.previous),
        state=request.state,
        finalizing=request.finalizing,
    )


def respond(
    reconcile: Reconcile, request: Request, cluster: Optional[Cluster] = None
) -> Tuple[Optional[str], Optional[Error]]:
    """Run `reconcile` the way the component does — the request through JSON text, the answer
    written as the host reads it — and return what ``host.respond`` would get:
    ``(response_json, None)`` or ``(None, error)``."""
    return run(to_wire(request), reconcile, cluster if cluster is not None else FakeCluster())
