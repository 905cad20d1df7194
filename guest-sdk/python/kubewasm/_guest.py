"""The component side of the SDK: the ``reconcile`` export and the :class:`Cluster` over the
host imports. Imported only inside the component (by the entry module ``build.sh`` writes),
where componentize-py has generated ``wit_world`` from ``guest-sdk/wit/kubewasm.wit``; native
tests never import it.

Everything it needs is imported here, at the top: componentize-py runs the imports at build
time and snapshots the interpreter, and the sandbox gives the guest no files to import from
later.
"""

from typing import Any, Dict, List, Optional

import wit_world
from componentize_py_types import Err, Ok
from wit_world.imports import host
from wit_world.imports import types as wit

from . import query
from .cluster import Cluster, LogLevel
from .errors import Error, from_host
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


class WitWorld(wit_world.WitWorld):
    """The ``reconcile`` export of the ``kubewasm:controller`` world."""

    def reconcile(self, request: wit.Request) -> None:
        response, error = run(request, exported(), HostCluster())
        if error is None:
            host.respond(Ok(response))
        else:
            # A message is text for people: a lone surrogate must not stop the answer.
            message = error.message.encode("utf-8", "replace").decode("utf-8")
            host.respond(Err(wit.Error(message=message, retryable=error.retryable)))
