"""Write kubewasm controllers as plain Python functions.

A guest is one function from a :class:`Request` (the target object, its observed state and
children) to a :class:`Response` (actions for the host to carry out), with read access to the
cluster through a :class:`Cluster`. :func:`reconciler` makes it the ``reconcile`` export of the
``kubewasm:controller`` WIT world when ``guest-sdk/python/build.sh`` builds the module into a
component; in ``pytest`` the same function runs natively against
:class:`kubewasm.testing.FakeCluster`.

.. code-block:: python

    import kubewasm
    from kubewasm import objects

    @kubewasm.reconciler
    def reconcile(request, cluster):
        \"\"\"Keep one ConfigMap per parent, carrying the parent's spec.greeting.\"\"\"
        parent = request.parent
        if parent is None:
            return kubewasm.Response()  # gone: the host garbage-collects the children
        greeting = objects.spec_str(parent, "greeting") or "hello"
        config = objects.child_of(parent, "v1", "ConfigMap", request.target.name).data(
            {"greeting": greeting}
        )
        return kubewasm.Response().apply(config).set_status({"ready": True})

This mirrors the Rust SDK (``guest-sdk/src``): the same request, the same actions and the same
wire format, checked by the same host.
"""

from . import objects, query, selector
from .cluster import Cluster, LogLevel
from .errors import Error, PermanentError, RetryableError
from .request import ObjectRef, Request
from .response import (
    MAX_STATE_BYTES,
    Action,
    Apply,
    Delete,
    DeleteAllOf,
    Event,
    EventType,
    Finalized,
    RequeueAfter,
    Response,
    SetState,
    SetStatus,
)
from .wire import reconciler

__all__ = [
    "Action",
    "Apply",
    "Cluster",
    "Delete",
    "DeleteAllOf",
    "Error",
    "Event",
    "EventType",
    "Finalized",
    "LogLevel",
    "MAX_STATE_BYTES",
    "ObjectRef",
    "PermanentError",
    "Request",
    "RequeueAfter",
    "Response",
    "RetryableError",
    "SetState",
    "SetStatus",
    "objects",
    "query",
    "reconciler",
    "selector",
]
