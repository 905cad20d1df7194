"""One read, resolved: which kind, where it looks, which labels — and the one filter and the one
order that every answer uses.

A port of the Rust SDK's ``query`` module. The runtime's shared cache, ``kubewasm reconcile``
and :class:`kubewasm.testing.FakeCluster` answer reads by these rules, so a guest's native tests
see what the runtime would hand it, and are refused where the runtime refuses:

- a namespaced kind is read in the namespace asked for, else the default one (the target's),
  else in every namespace;
- a cluster-scoped kind is read without a namespace; naming one is an error;
- names and namespaces must be valid Kubernetes names (nothing that could change a URL);
- a label selector must parse (see :mod:`kubewasm.selector`);
- results are sorted by namespace, then name.
"""

import re
from typing import List, Optional

from . import objects
from ._text import printable, truncate, utf8_len
from .errors import PermanentError
from .selector import Selector, SelectorError

#: Longest object name Kubernetes accepts (a DNS subdomain).
MAX_NAME_BYTES = 253

#: Longest namespace name (a DNS label).
MAX_NAMESPACE_BYTES = 63

#: Where a read looks: one namespace (:attr:`Query.namespace` says which), every namespace of a
#: namespaced kind, or a cluster-scoped kind.
NAMESPACE, ALL_NAMESPACES, CLUSTER = "namespace", "all-namespaces", "cluster"


class QueryError(PermanentError):
    """A read that cannot even be asked (permanent: the same read fails the same way)."""


class Query:
    """A resolved read of objects of one kind."""

    __slots__ = ("api_version", "kind", "scope", "namespace", "selector")

    def __init__(
        self,
        api_version: str,
        kind: str,
        namespaced: bool,
        namespace: Optional[str] = None,
        default_namespace: Optional[str] = None,
        label_selector: Optional[str] = None,
    ):
        """Resolves a read of `kind` (whose scope the caller knows: `namespaced`) in
        `namespace`, falling back to `default_namespace` (the target's) for namespaced kinds.
        Raises :class:`QueryError`."""
        self.api_version = api_version
        self.kind = kind
        #: The one namespace this query looks in, if it is confined to one.
        self.namespace: Optional[str] = None
        if not namespaced:
            if namespace is not None:
                raise QueryError(
                    f"{kind} ({api_version}) is cluster-scoped: read it without a namespace "
                    f"(asked for namespace `{printable(namespace)}`)"
                )
            self.scope = CLUSTER
        else:
            asked = namespace if namespace is not None else default_namespace
            if asked is None:
                self.scope = ALL_NAMESPACES
            else:
                validate_namespace(asked)
                self.scope = NAMESPACE
                self.namespace = asked
        self.selector = parse_selector(label_selector)

    def matches_meta(self, namespace: Optional[str], labels) -> bool:
        """Whether an object's namespace and labels fit (its kind is known to be right)."""
        if self.scope == NAMESPACE:
            placed = namespace == self.namespace
        elif self.scope == ALL_NAMESPACES:
            placed = namespace is not None
        else:
            placed = namespace is None
        return placed and self.selector.matches(labels)

    def matches(self, obj: dict) -> bool:
        """Whether an object (as the API serves it) is one this query returns."""
        metadata = obj.get("metadata") if isinstance(obj, dict) else None
        labels = metadata.get("labels") if isinstance(metadata, dict) else None
        return (
            objects.api_version(obj) == self.api_version
            and objects.kind(obj) == self.kind
            and self.matches_meta(
                objects.namespace(obj), labels if isinstance(labels, dict) else None
            )
        )

    def finds(self, obj: dict, name: str) -> bool:
        """Whether `obj` is the object called `name` that this query can see."""
        return objects.name(obj) == name and self.matches(obj)


def sort(found: List[dict]) -> None:
    """Puts query results in their one order: by namespace, then name (in place)."""

    def key(obj):
        ns, name = objects.namespace(obj), objects.name(obj)
        return (ns is not None, ns or "", name is not None, name or "")

    found.sort(key=key)


def parse_selector(label_selector: Optional[str]) -> Selector:
    """Parses an optional label selector with the message every reader uses."""
    if label_selector is None:
        return Selector()
    try:
        return Selector.parse(label_selector)
    except SelectorError as e:
        raise QueryError(
            f"invalid label selector `{printable(truncate(label_selector, 128))}`: {e}"
        ) from None


_NAME = re.compile(r"[A-Za-z0-9._:-]+\Z", re.ASCII)
_DNS_LABEL = re.compile(r"[a-z0-9]([a-z0-9-]*[a-z0-9])?\Z", re.ASCII)


def validate_name(name: str) -> None:
    """An object name: 1 to 253 characters of ``a-z A-Z 0-9 . - _ :``, not ``.`` or ``..``.
    Raises :class:`QueryError` for anything that could change the meaning of an API path."""
    ok = (
        name != ""
        and utf8_len(name) <= MAX_NAME_BYTES
        and name not in (".", "..")
        and _NAME.match(name) is not None
    )
    if not ok:
        raise QueryError(
            f"invalid object name `{printable(truncate(name, 128))}`: a name is 1 to "
            f"{MAX_NAME_BYTES} characters of letters, digits, `.`, `-`, `_` and `:`"
        )


def validate_namespace(namespace: str) -> None:
    """A namespace name: a DNS label (1 to 63 of ``a-z 0-9 -``, starting and ending
    alphanumeric). Raises :class:`QueryError`."""
    if utf8_len(namespace) > MAX_NAMESPACE_BYTES or not _DNS_LABEL.match(namespace):
        raise QueryError(
            f"invalid namespace `{printable(truncate(namespace, 128))}`: a namespace is 1 to "
            f"{MAX_NAMESPACE_BYTES} characters of `a-z`, `0-9` and `-`"
        )
