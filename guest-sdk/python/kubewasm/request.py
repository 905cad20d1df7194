"""What one call to ``reconcile`` is about: the target object, its observed state and children."""

import dataclasses
import json
from typing import Any, Dict, List, Optional

from . import objects
from .errors import PermanentError


@dataclasses.dataclass(frozen=True, order=True)
class ObjectRef:
    """Names one object: what it is (`api_version`, `kind`) and which one (`namespace`,
    `name`). On the wire: ``{"apiVersion", "kind", "namespace"?, "name"}``."""

    api_version: str
    kind: str
    namespace: Optional[str]
    name: str

    @classmethod
    def of(cls, obj: Any) -> "ObjectRef":
        """The reference to a Kubernetes object (a dict). Raises :class:`PermanentError` when
        `obj` is not a dict or lacks ``apiVersion``, ``kind`` or ``metadata.name``."""
        if not isinstance(obj, dict):
            raise PermanentError(
                f"not a Kubernetes object: expected a JSON object, got `{_short(obj)}`"
            )

        def field(value: Optional[str], what: str) -> str:
            if value is None:
                raise PermanentError(f"not a Kubernetes object: missing `{what}`")
            return value

        return cls(
            field(objects.api_version(obj), "apiVersion"),
            field(objects.kind(obj), "kind"),
            objects.namespace(obj),
            field(objects.name(obj), "metadata.name"),
        )

    def refers_to(self, obj: Any) -> bool:
        """Whether `obj` is the object this reference names."""
        return (
            objects.api_version(obj) == self.api_version
            and objects.kind(obj) == self.kind
            and objects.namespace(obj) == self.namespace
            and objects.name(obj) == self.name
        )

    def to_wire(self) -> Dict[str, str]:
        """As the response document writes it (``namespace`` left out when ``None``)."""
        wire = {"apiVersion": self.api_version, "kind": self.kind}
        if self.namespace is not None:
            wire["namespace"] = self.namespace
        wire["name"] = self.name
        return wire

    def __str__(self) -> str:
        """``Kind namespace/name``, or ``Kind name`` for a cluster-scoped object."""
        if self.namespace is not None:
            return f"{self.kind} {self.namespace}/{self.name}"
        return f"{self.kind} {self.name}"


def _short(value: Any) -> str:
    """At most the first 60 bytes of `value` as JSON, for messages."""
    try:
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), sort_keys=True)
    except (TypeError, ValueError):
        text = repr(value)
    encoded = text.encode("utf-8", "surrogatepass")
    if len(encoded) > 60:
        return encoded[:60].decode("utf-8", "ignore") + "…"
    return text


@dataclasses.dataclass
class Request:
    """The input of one reconcile.

    Objects are dicts, as the API server serves them. Build requests for tests with
    :meth:`for_object` or :meth:`gone` and the ``with_*`` methods (or
    :func:`kubewasm.testing.request_from_yaml`).
    """

    #: The controller being run, as ``namespace/name`` of its WasmController.
    controller: str
    #: The object this call is about (set even when the object is gone).
    target: ObjectRef
    #: The object as last observed, or ``None`` when it no longer exists.
    parent: Optional[Dict[str, Any]] = None
    #: For composite controllers: the observed children owned by the parent.
    children: List[Dict[str, Any]] = dataclasses.field(default_factory=list)
    #: The object as this controller's last successful reconcile of it saw it; ``None`` the
    #: first time since the runtime (or the controller) started. With `parent`, it tells what
    #: changed.
    previous: Optional[Dict[str, Any]] = None
    #: What this controller saved for the target with :meth:`Response.set_state`, kept by the
    #: runtime across restarts; ``None`` when nothing is saved. At most
    #: :data:`kubewasm.MAX_STATE_BYTES` bytes.
    state: Optional[str] = None
    #: The target is being deleted and still carries this controller's finalizer
    #: (``spec.finalize``): clean up, then answer with :meth:`Response.finalized`.
    finalizing: bool = False

    @classmethod
    def for_object(cls, parent: Dict[str, Any]) -> "Request":
        """A request about an existing object, with no children. Raises
        :class:`PermanentError` when `parent` is not a named object."""
        return cls(controller="", target=ObjectRef.of(parent), parent=parent)

    @classmethod
    def gone(cls, target: ObjectRef) -> "Request":
        """A request about an object that no longer exists."""
        return cls(controller="", target=target)

    def with_children(self, children: List[Dict[str, Any]]) -> "Request":
        """The same request with these observed children."""
        return dataclasses.replace(self, children=list(children))

    def with_previous(self, previous: Dict[str, Any]) -> "Request":
        """The same request with the object as last reconciled."""
        return dataclasses.replace(self, previous=previous)

    def with_state(self, state: str) -> "Request":
        """The same request with this saved state."""
        return dataclasses.replace(self, state=state)

    def as_finalizing(self) -> "Request":
        """The same request for a target being deleted that still carries this controller's
        finalizer."""
        return dataclasses.replace(self, finalizing=True)

    def with_controller(self, controller: str) -> "Request":
        """The same request naming this controller (``namespace/name``)."""
        return dataclasses.replace(self, controller=controller)

    def children_of(self, api_version: str, kind: str) -> List[Dict[str, Any]]:
        """The observed children of one kind, e.g. ``children_of("v1", "Pod")``."""
        return [
            child
            for child in self.children
            if objects.api_version(child) == api_version and objects.kind(child) == kind
        ]
