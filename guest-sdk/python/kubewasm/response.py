"""What a reconcile wants done: an ordered list of actions, built with :class:`Response`'s
methods.

In the response document each action is an object with one key, the action's name in
camelCase (``{"apply": {...}}``, ``{"deleteAllOf": {...}}``, ``{"requeueAfterMillis": 1000}``);
see the ``respond`` function of the WIT contract (``guest-sdk/wit/kubewasm.wit``). The host
refuses unknown keys; :meth:`Response.to_json` writes exactly what the Rust SDK writes.

>>> from kubewasm import Response, EventType
>>> response = (Response()
...     .apply({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}})
...     .set_status({"ready": True})
...     .event(EventType.NORMAL, "Configured", "wrote ConfigMap c"))
>>> len(response.actions)
3
"""

import dataclasses
import datetime
import enum
import json
from typing import Any, Dict, List, Optional, Tuple, Union

from .errors import PermanentError
from .request import ObjectRef

#: The most bytes of the state a controller saves for one object (:meth:`Response.set_state`);
#: a longer state fails the reconcile (the host checks). Keep a digest or a version, not data.
MAX_STATE_BYTES = 512

_U64_MAX = 2**64 - 1

#: The response document's writer, made once: ``json.dumps`` with these options makes a new
#: encoder at every call, a tenth of a Python guest's reconcile in the sandbox.
_ENCODER = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))


class EventType(str, enum.Enum):
    """Whether an Event reports something normal or something to look at."""

    #: Routine progress.
    NORMAL = "Normal"
    #: Something went wrong or needs attention.
    WARNING = "Warning"

    def __str__(self) -> str:
        return self.value


@dataclasses.dataclass(frozen=True)
class Apply:
    """Create or update an object with server-side apply. A partial object (only the fields
    this controller manages) touches only those fields."""

    object: Dict[str, Any]

    def to_wire(self) -> Dict[str, Any]:
        return {"apply": self.object}


@dataclasses.dataclass(frozen=True)
class Delete:
    """Delete one object."""

    ref: ObjectRef

    def to_wire(self) -> Dict[str, Any]:
        return {"delete": self.ref.to_wire()}


@dataclasses.dataclass(frozen=True)
class DeleteAllOf:
    """Delete every object of a kind whose labels match a selector (the selector must name a
    label they have), optionally only those created strictly before `created_before`
    (RFC 3339, e.g. ``2026-11-23T12:00:00Z``)."""

    api_version: str
    kind: str
    #: Namespace to delete in; ``None`` means the target's namespace.
    namespace: Optional[str]
    #: A label selector such as ``app=web,tier!=db`` (see :mod:`kubewasm.selector`).
    label_selector: str
    created_before: Optional[str] = None

    def to_wire(self) -> Dict[str, Any]:
        wire: Dict[str, Any] = {"apiVersion": self.api_version, "kind": self.kind}
        if self.namespace is not None:
            wire["namespace"] = self.namespace
        wire["labelSelector"] = self.label_selector
        if self.created_before is not None:
            wire["createdBefore"] = self.created_before
        return {"deleteAllOf": wire}


@dataclasses.dataclass(frozen=True)
class SetStatus:
    """Replace the target's ``status`` with this object."""

    status: Any

    def to_wire(self) -> Dict[str, Any]:
        return {"setStatus": self.status}


@dataclasses.dataclass(frozen=True)
class Event:
    """Record an Event on the target."""

    type: EventType
    #: A short CamelCase reason, e.g. ``PodsRestarted``.
    reason: str
    #: A sentence a person can read.
    message: str

    def to_wire(self) -> Dict[str, Any]:
        return {
            "event": {
                "type": EventType(self.type).value,
                "reason": self.reason,
                "message": self.message,
            }
        }


@dataclasses.dataclass(frozen=True)
class RequeueAfter:
    """Reconcile the target again after this many milliseconds."""

    millis: int

    def to_wire(self) -> Dict[str, Any]:
        return {"requeueAfterMillis": self.millis}


@dataclasses.dataclass(frozen=True)
class SetState:
    """Save this controller's state for the target (``None``: forget it); handed back in
    :attr:`kubewasm.Request.state`. The runtime writes it before it runs the next action."""

    state: Optional[str]

    def to_wire(self) -> Dict[str, Any]:
        return {"setState": self.state}


@dataclasses.dataclass(frozen=True)
class Finalized:
    """While :attr:`kubewasm.Request.finalizing`: clean-up is done, remove the finalizer once
    the response's other actions succeeded (``False`` is the same as leaving it out)."""

    done: bool = True

    def to_wire(self) -> Dict[str, Any]:
        return {"finalized": self.done}


#: One thing the guest wants done.
Action = Union[Apply, Delete, DeleteAllOf, SetStatus, Event, RequeueAfter, SetState, Finalized]


def _millis(delay: Union[datetime.timedelta, int, float]) -> int:
    """A delay (a timedelta, or seconds) as whole milliseconds, saturating at u64."""
    if isinstance(delay, datetime.timedelta):
        millis = delay // datetime.timedelta(milliseconds=1)
    elif isinstance(delay, (int, float)) and not isinstance(delay, bool):
        if delay != delay:  # NaN
            raise ValueError("a requeue delay must be a number of seconds, not NaN")
        millis = int(min(round(delay * 1000), _U64_MAX)) if delay != float("inf") else _U64_MAX
    else:
        raise TypeError(f"a requeue delay is a timedelta or seconds, not {type(delay).__name__}")
    if millis < 0:
        raise ValueError(f"a requeue delay cannot be negative: {delay!r}")
    return min(millis, _U64_MAX)


def _as_object(obj: Any) -> Dict[str, Any]:
    build = getattr(obj, "build", None)
    return build() if callable(build) else obj


@dataclasses.dataclass
class Response:
    """The output of one reconcile: actions carried out in order. An empty response means
    "nothing to do". Each method appends one action and returns the response, so calls
    chain."""

    actions: List[Action] = dataclasses.field(default_factory=list)

    def push(self, action: Action) -> "Response":
        """Append any action."""
        self.actions.append(action)
        return self

    def apply(self, obj: Any) -> "Response":
        """Apply an object (server-side apply): a dict or an
        :class:`~kubewasm.objects.ObjectBuilder`."""
        return self.push(Apply(_as_object(obj)))

    def delete(self, ref: ObjectRef) -> "Response":
        """Delete one object."""
        return self.push(Delete(ref))

    def delete_all_of(
        self,
        api_version: str,
        kind: str,
        namespace: Optional[str],
        label_selector: str,
        created_before: Optional[str] = None,
    ) -> "Response":
        """Delete every `api_version`/`kind` object in `namespace` (``None``: the target's)
        whose labels match `label_selector`; with `created_before` (RFC 3339), only those
        created strictly earlier."""
        return self.push(DeleteAllOf(api_version, kind, namespace, label_selector, created_before))

    def delete_all_created_before(
        self,
        api_version: str,
        kind: str,
        namespace: Optional[str],
        label_selector: str,
        created_before: str,
    ) -> "Response":
        """:meth:`delete_all_of` with `created_before`, as the Rust SDK spells it."""
        return self.delete_all_of(api_version, kind, namespace, label_selector, created_before)

    def set_state(self, state: str) -> "Response":
        """Save this controller's state for the target (at most :data:`MAX_STATE_BYTES`)."""
        if not isinstance(state, str):
            raise TypeError(f"the state is a string, not {type(state).__name__}")
        return self.push(SetState(state))

    def clear_state(self) -> "Response":
        """Forget this controller's state for the target."""
        return self.push(SetState(None))

    def finalized(self) -> "Response":
        """Clean-up is done: let the deletion of the target go on."""
        return self.push(Finalized(True))

    def set_status(self, status: Any) -> "Response":
        """Replace the target's status.

        Set after an apply that writes an owned child, the status is left to the next
        reconcile, which the child's watch event brings at once with the child observed (the
        host's rule; see the Rust SDK's ``Response::set_status``)."""
        return self.push(SetStatus(status))

    def event(self, type: Union[EventType, str], reason: str, message: str) -> "Response":
        """Record an Event on the target (`type`: :class:`EventType` or ``"Normal"`` /
        ``"Warning"``)."""
        return self.push(Event(EventType(type), reason, message))

    def requeue_after(self, delay: Union[datetime.timedelta, int, float]) -> "Response":
        """Reconcile the target again after `delay` (a timedelta, or seconds; millisecond
        precision)."""
        return self.push(RequeueAfter(_millis(delay)))

    # Reading a response, for tests.

    def state(self) -> Optional[SetState]:
        """The last :class:`SetState` of this response (its ``state`` is ``None`` when it
        forgets), or ``None`` when the response leaves the state alone."""
        for action in reversed(self.actions):
            if isinstance(action, SetState):
                return action
        return None

    def is_finalized(self) -> bool:
        """Whether this response says clean-up is done."""
        return any(isinstance(a, Finalized) and a.done for a in self.actions)

    def is_empty(self) -> bool:
        """Whether there is nothing to do."""
        return not self.actions

    def applied(self) -> List[Dict[str, Any]]:
        """The objects this response applies, in order."""
        return [a.object for a in self.actions if isinstance(a, Apply)]

    def status(self) -> Any:
        """The status this response sets (the last one), or ``None``."""
        for action in reversed(self.actions):
            if isinstance(action, SetStatus):
                return action.status
        return None

    def events(self) -> List[Tuple[EventType, str, str]]:
        """The events this response records, as ``(type, reason, message)``."""
        return [(a.type, a.reason, a.message) for a in self.actions if isinstance(a, Event)]

    def to_wire(self) -> Dict[str, Any]:
        """The response document as a dict: ``{"actions": [...]}``."""
        return {"actions": [action.to_wire() for action in self.actions]}

    def to_json(self) -> str:
        """The response document the host reads. Raises :class:`PermanentError` when an action
        holds something JSON cannot write (a set, NaN, a string with a lone surrogate...)."""
        try:
            text = _ENCODER.encode(self.to_wire())
            text.encode("utf-8")
        except (TypeError, ValueError, RecursionError) as e:
            raise PermanentError(f"cannot write the response as JSON: {e}") from None
        return text
