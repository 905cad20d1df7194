"""Small helpers for Kubernetes objects as dicts: read common fields and build new objects.

The Rust SDK's ``object`` module for Python (named ``objects`` so that importing it does not
hide the builtin ``object``). Objects are plain dicts, as ``json.loads`` makes them: index them
freely; these helpers are for the fields every controller reads, and they never raise — a
missing field, or one of the wrong type, is ``None``.

>>> from kubewasm import objects
>>> parent = {"apiVersion": "example.com/v1", "kind": "HelloWorld",
...           "metadata": {"name": "hi", "namespace": "demo"}, "spec": {"who": "Ada"}}
>>> objects.spec_str(parent, "who")
'Ada'
>>> pod = objects.child_of(parent, "v1", "Pod", "hi").label("app", "hello").build()
>>> objects.namespace(pod), objects.label(pod, "app")
('demo', 'hello')
"""

from typing import Any, Dict, Optional


def _field(obj: Any, *path: str) -> Any:
    for key in path:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(key)
    return obj


def _str(value: Any) -> Optional[str]:
    return value if isinstance(value, str) else None


def api_version(obj: Any) -> Optional[str]:
    """``apiVersion`` of an object."""
    return _str(_field(obj, "apiVersion"))


def kind(obj: Any) -> Optional[str]:
    """``kind`` of an object."""
    return _str(_field(obj, "kind"))


def name(obj: Any) -> Optional[str]:
    """``metadata.name`` of an object."""
    return _str(_field(obj, "metadata", "name"))


def namespace(obj: Any) -> Optional[str]:
    """``metadata.namespace`` of an object (``None`` for cluster-scoped objects)."""
    return _str(_field(obj, "metadata", "namespace"))


def uid(obj: Any) -> Optional[str]:
    """``metadata.uid`` of an object."""
    return _str(_field(obj, "metadata", "uid"))


def label(obj: Any, key: str) -> Optional[str]:
    """One label's value."""
    return _str(_field(obj, "metadata", "labels", key))


def annotation(obj: Any, key: str) -> Optional[str]:
    """One annotation's value."""
    return _str(_field(obj, "metadata", "annotations", key))


def _string_map(obj: Any, which: str) -> Dict[str, str]:
    entries = _field(obj, "metadata", which)
    if not isinstance(entries, dict):
        return {}
    return {k: v for k, v in sorted(entries.items()) if isinstance(v, str)}


def labels(obj: Any) -> Dict[str, str]:
    """All labels (string values only), sorted by key; empty when there are none."""
    return _string_map(obj, "labels")


def annotations(obj: Any) -> Dict[str, str]:
    """All annotations (string values only), sorted by key; empty when there are none."""
    return _string_map(obj, "annotations")


def spec(obj: Any) -> Any:
    """``spec`` of an object."""
    return _field(obj, "spec")


def spec_str(obj: Any, field: str) -> Optional[str]:
    """A string field of ``spec``, e.g. ``spec_str(obj, "who")`` for ``spec.who``; ``None``
    when it is missing or not a string."""
    return _str(_field(obj, "spec", field))


class ObjectBuilder:
    """Builds a Kubernetes object as a dict: finish it with :meth:`build`, or pass the builder
    straight to :meth:`kubewasm.Response.apply`. Each setter returns the builder."""

    __slots__ = ("_root",)

    def __init__(self, root: Dict[str, Any]):
        self._root = root

    def label(self, key: str, value: str) -> "ObjectBuilder":
        """Set a label."""
        return self._metadata_entry("labels", key, value)

    def annotation(self, key: str, value: str) -> "ObjectBuilder":
        """Set an annotation."""
        return self._metadata_entry("annotations", key, value)

    def field(self, key: str, value: Any) -> "ObjectBuilder":
        """Set a top-level field, e.g. ``field("data", {...})``."""
        self._root[key] = value
        return self

    def spec(self, spec: Any) -> "ObjectBuilder":
        """Set ``spec``."""
        return self.field("spec", spec)

    def data(self, data: Any) -> "ObjectBuilder":
        """Set ``data`` (ConfigMaps, Secrets)."""
        return self.field("data", data)

    def build(self) -> Dict[str, Any]:
        """The finished object (a new dict each time; the builder can go on)."""
        return _copy(self._root)

    def _metadata_entry(self, which: str, key: str, value: str) -> "ObjectBuilder":
        metadata = _object_entry(self._root, "metadata")
        _object_entry(metadata, which)[key] = value
        return self

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ObjectBuilder):
            return NotImplemented
        return self._root == other._root

    def __repr__(self) -> str:
        return f"ObjectBuilder({self._root!r})"


def _object_entry(parent: Dict[str, Any], key: str) -> Dict[str, Any]:
    """The dict at ``parent[key]``, made an empty dict first when missing or not a dict."""
    entry = parent.get(key)
    if not isinstance(entry, dict):
        entry = parent[key] = {}
    return entry


def _copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value


def new(api_version: str, kind: str, namespace: Optional[str], name: str) -> ObjectBuilder:
    """Start an object of `api_version`/`kind` named `name` in `namespace` (``None``:
    cluster-scoped, or left for the host to fill in). The Rust SDK's ``object::object``."""
    metadata: Dict[str, Any] = {"name": name}
    if namespace is not None:
        metadata["namespace"] = namespace
    return ObjectBuilder({"apiVersion": api_version, "kind": kind, "metadata": metadata})


def child_of(parent: Any, api_version: str, kind: str, name: str) -> ObjectBuilder:
    """Start a child object of `parent`, in the parent's namespace. The host adds the
    controller ownerReference when it applies the child."""
    return new(api_version, kind, namespace(parent), name)
