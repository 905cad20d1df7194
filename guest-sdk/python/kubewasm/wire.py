"""The request as it crosses the WIT boundary (each JSON document as text), the answer the guest
hands back to ``host.respond``, and the registry of the guest's reconcile function.

Plain Python, no WIT bindings: the component's entry (:mod:`kubewasm._guest`) and the native
tests (:func:`kubewasm.testing.respond`) both go through :func:`run`, so a test sees the exact
document and error the host would get.
"""

import json
import sys
import traceback
from typing import Any, Callable, List, Optional, Tuple

from .cluster import Cluster
from .errors import Error, RetryableError, invalid_json
from .request import ObjectRef, Request
from .response import Response

#: The signature of a guest's reconcile function.
Reconcile = Callable[[Request, Cluster], Response]

_registered: List[Reconcile] = []


def reconciler(fn: Reconcile) -> Reconcile:
    """Make `fn` — ``fn(request, cluster) -> Response`` — the guest's ``reconcile``.

    Use it once per guest module, on a top-level function. It returns `fn` unchanged, so the
    function stays an ordinary, testable function; the component built from the module
    (``guest-sdk/python/build.sh``) calls it for every reconcile.
    """
    if not callable(fn):
        raise TypeError(f"@kubewasm.reconciler decorates a function, not {fn!r}")
    if fn not in _registered:
        _registered.append(fn)
    return fn


def exported() -> Reconcile:
    """The one function decorated with :func:`reconciler`. Raises ``RuntimeError`` unless
    there is exactly one (the component build calls it, so a guest without one, or with
    several, does not build)."""
    if len(_registered) != 1:
        names = ", ".join(f"{f.__module__}.{f.__qualname__}" for f in _registered) or "none"
        raise RuntimeError(
            "a kubewasm guest has exactly one function decorated with @kubewasm.reconciler; "
            f"found {len(_registered)} ({names})"
        )
    return _registered[0]


#: Reads the request's documents. The host writes each as compact JSON, which ``raw_decode``
#: reads whole without ``json.loads``' two whitespace scans around it.
_DECODER = json.JSONDecoder()


def _document(text: Optional[str]) -> Any:
    if text is None:
        return None
    try:
        value, end = _DECODER.raw_decode(text)
        if end == len(text):
            return value
    except ValueError:
        pass
    try:
        # Whitespace around it is still JSON; anything else gets json.loads' own message.
        return json.loads(text)
    except ValueError as e:
        raise invalid_json(e) from None


def parse_request(wire: Any) -> Request:
    """The request a guest's reconcile function gets, from the WIT ``request`` record (or
    anything with its attributes). Raises :class:`~kubewasm.PermanentError` on a document
    that is not JSON."""
    target = wire.target
    return Request(
        controller=wire.controller,
        target=ObjectRef(target.api_version, target.kind, target.namespace, target.name),
        parent=_document(wire.parent),
        children=[_document(child) for child in wire.children],
        previous=_document(wire.previous),
        state=wire.state,
        finalizing=bool(wire.finalizing),
    )


def run(wire: Any, reconcile: Reconcile, cluster: Cluster) -> Tuple[Optional[str], Optional[Error]]:
    """One reconcile as the host sees it: parse the request, call the guest, and write its
    answer: ``(response_json, None)`` or ``(None, error)``.

    A :class:`~kubewasm.Error` the guest raises is its answer. ``MemoryError`` is raised on: the
    call traps, and the host reports its memory limit. Any other exception is a bug in the
    guest, answered like a Rust guest's panic: retryable (the host backs off; the observed
    state may change), with its type and message, and its traceback written to stderr (which
    the host logs).
    """
    try:
        request = parse_request(wire)
        response = reconcile(request, cluster)
        if not isinstance(response, Response):
            raise TypeError(
                f"reconcile returned {type(response).__name__}, not a kubewasm.Response "
                "(return Response() when there is nothing to do)"
            )
        return response.to_json(), None
    except Error as e:
        return None, e
    except MemoryError:
        # Out of memory is the sandbox's limit, not the guest's answer: it traps the call, and
        # the host reports "memory limit exceeded" as it does for a Rust guest.
        raise
    except Exception as e:  # noqa: BLE001 - the guest's bug becomes an error the host shows
        traceback.print_exc(file=sys.stderr)
        return None, RetryableError(f"reconcile raised {type(e).__name__}: {e}")
