"""Reads and logging a guest may use while reconciling, behind one interface so that native
tests can hand the guest a fake cluster (:class:`kubewasm.testing.FakeCluster`).

Inside the component, the cluster is the host's imports (``get``, ``list``, ``log`` of the WIT
contract): reads come from the runtime's shared cache, limited to the kinds the controller
declared, and log lines are tagged by the host with the controller and the target. Every
implementation refuses the same things the same way: an invalid name, namespace or selector
is a :class:`~kubewasm.PermanentError` raised before the host is asked; a read the host refuses
(a kind not granted) is the host's :class:`~kubewasm.Error`, retryable or not as it says.
"""

import abc
import enum
from typing import Any, Dict, List, Optional


class LogLevel(enum.Enum):
    """Severity of a log line (the WIT ``log-level``)."""

    TRACE = "trace"
    DEBUG = "debug"
    INFO = "info"
    WARN = "warn"
    ERROR = "error"


class Cluster(abc.ABC):
    """The cluster as a guest sees it: reads of the kinds the controller declared, and the
    host's log."""

    @abc.abstractmethod
    def get(
        self, api_version: str, kind: str, name: str, *, namespace: Optional[str] = None
    ) -> Optional[Dict[str, Any]]:
        """Read one object; ``None`` when it does not exist. `namespace` ``None`` means the
        target's namespace for namespaced kinds."""

    @abc.abstractmethod
    def list(
        self,
        api_version: str,
        kind: str,
        namespace: Optional[str] = None,
        label_selector: Optional[str] = None,
    ) -> List[Dict[str, Any]]:
        """List objects of one kind in one namespace (``None``: the target's namespace for
        namespaced kinds), optionally filtered by a label selector such as ``app=web``;
        sorted by namespace, then name."""

    @abc.abstractmethod
    def log(self, level: LogLevel, message: str) -> None:
        """Write a log line, tagged by the host with the controller and the target."""

    def trace(self, message: str) -> None:
        """Log at :attr:`LogLevel.TRACE`."""
        self.log(LogLevel.TRACE, message)

    def debug(self, message: str) -> None:
        """Log at :attr:`LogLevel.DEBUG`."""
        self.log(LogLevel.DEBUG, message)

    def info(self, message: str) -> None:
        """Log at :attr:`LogLevel.INFO`."""
        self.log(LogLevel.INFO, message)

    def warn(self, message: str) -> None:
        """Log at :attr:`LogLevel.WARN`."""
        self.log(LogLevel.WARN, message)

    def error(self, message: str) -> None:
        """Log at :attr:`LogLevel.ERROR`."""
        self.log(LogLevel.ERROR, message)
