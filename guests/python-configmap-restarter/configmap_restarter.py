"""The ConfigMap restarter of the controller tutorials, level-based, as a kubewasm guest in
Python: the same behaviour and crash guarantees as the Rust guest (guests/configmap-restarter,
whose module documentation explains the design), the same saved state (a module built from
either can take over from the other), and the same tests.

A ConfigMap annotated ``magalix.com/podDeleteMatch: "<label selector>"`` names the Pods that use
it; when its data changes, every Pod in its namespace that matches the selector is deleted (and
recreated by its Deployment with the new data). The tutorial reacts to update events, so a
change made while it is down is lost; this guest saves, as its state for the ConfigMap, the
digest of the data the Pods were last restarted for, and compares it with the digest of the
data it observes now:

- no state yet (first sighting): save the digest, restart nothing;
- same digest (e.g. a metadata-only change): nothing;
- another digest: list the matching Pods and take the bound — the newest ``creationTimestamp``
  among them, or the time the data changed if that is later — save
  ``pending:<new digest>@<bound>``, delete the matching Pods created no later than the bound's
  second, save the new digest, emit ``PodsRestarted`` (with nothing to bound it by, save
  ``pending:<new digest>`` and delete every matching Pod, as the tutorial does);
- ``pending:<this digest>@<bound>``: an attempt for this data did not finish (the runtime was
  killed between the deletions and saving the digest, or a delete failed): delete the matching
  Pods created no later than the saved bound's second again — the replacements, made after the
  first deletions, are newer and spared — then save the digest and emit ``PodsRestarted``.

The host writes each ``setState`` before it runs the next action, so a Pod is deleted only once
``pending:`` is safe, and nothing restarts twice. It needs no write on the ConfigMap: the
tutorial's ServiceAccount ``joe`` (read ConfigMaps; read and delete Pods) is enough.

An invalid (or empty, which would match every Pod) selector is the ConfigMap author's mistake:
a ``Warning`` Event ``InvalidSelector`` on the ConfigMap, nothing restarted, nothing saved.
"""

import hashlib
import json
import re
from typing import Any, List, NamedTuple, Optional

import kubewasm
from kubewasm import EventType, Response, objects
from kubewasm.selector import Selector, SelectorError

#: The annotation that opts a ConfigMap in, holding the selector of the Pods to restart.
SELECTOR_ANNOTATION = "magalix.com/podDeleteMatch"

#: The prefix of the state saved while a restart is under way: ``pending:<digest>@<bound>``.
PENDING = "pending:"


@kubewasm.reconciler
def reconcile(request, cluster):
    """Restart the ConfigMap's Pods once per change of its data."""
    config_map = request.parent
    if config_map is None:
        return Response()
    selector = objects.annotation(config_map, SELECTOR_ANNOTATION)
    if selector is None:
        return Response()
    metadata = config_map.get("metadata")
    if isinstance(metadata, dict) and "deletionTimestamp" in metadata:
        return Response()
    try:
        selector = str(parse_selector(selector))
    except ValueError as why:
        return Response().event(EventType.WARNING, "InvalidSelector", str(why))

    digest = data_digest(config_map)
    namespace = request.target.namespace
    response = Response()
    saved = request.state
    if saved is None:
        return response.set_state(digest)
    if saved == digest:
        return response
    pending = pending_bound(saved, digest)
    if pending is not None:
        # An unfinished attempt for this very data: the bound it saved.
        bound = pending.bound
    else:
        pods = cluster.list("v1", "Pod", namespace, selector)
        bound = restart_bound(pods, data_changed_at(config_map))
        response.set_state(pending_state(digest, bound))

    before = next_second(bound) if bound is not None else None
    if before is not None:
        response.delete_all_created_before("v1", "Pod", namespace, selector, before)
        since = f", created before {before}"
    else:
        # Nothing to bound it by (a Pod without a creation time, or no Pod and no time of the
        # change): every matching Pod, as the tutorial does.
        response.delete_all_of("v1", "Pod", namespace, selector)
        since = ""
    message = (
        f"ConfigMap data changed: deleted the Pods in namespace {namespace or ''} "
        # Quoted as the Rust guest's `{:?}` quotes it: a canonical selector has no character
        # that needs escaping.
        f'matching "{selector}"{since}'
    )
    return response.set_state(digest).event(EventType.NORMAL, "PodsRestarted", message)


class Pending(NamedTuple):
    """An unfinished restart: the bound it saved (``None``: every matching Pod goes)."""

    bound: Optional[str]


def pending_state(digest: str, bound: Optional[str]) -> str:
    """The state saved while a restart for `digest` is under way: ``pending:<digest>@<bound>``,
    or ``pending:<digest>`` when it is not bounded."""
    return f"{PENDING}{digest}@{bound}" if bound is not None else f"{PENDING}{digest}"


def pending_bound(saved: str, digest: str) -> Optional[Pending]:
    """The unfinished restart for `digest` saved as `saved`; ``None`` when `saved` is not one
    for this digest."""
    if not saved.startswith(PENDING + digest):
        return None
    rest = saved[len(PENDING + digest) :]
    if rest == "":
        return Pending(None)
    if rest.startswith("@"):
        return Pending(rest[1:])
    return None


def restart_bound(pods: List[Any], changed_at: Optional[str]) -> Optional[str]:
    """The newest ``creationTimestamp`` of `pods`, or `changed_at` when that is later.
    ``None`` (not bounded) when a Pod has no usable creation time, or when there is no Pod and
    no `changed_at`."""
    newest = changed_at if changed_at is not None and next_second(changed_at) else None
    for pod in pods:
        metadata = pod.get("metadata") if isinstance(pod, dict) else None
        created = metadata.get("creationTimestamp") if isinstance(metadata, dict) else None
        if not isinstance(created, str) or next_second(created) is None:
            return None
        # RFC 3339 in UTC with a fixed format (2026-11-23T12:00:00Z): text order is time order.
        if newest is None or created > newest:
            newest = created
    return newest


_DIGITS = re.compile(r"[+-]?[0-9]+\Z", re.ASCII)


def _num(text: str) -> Optional[int]:
    return int(text) if _DIGITS.match(text) else None


def next_second(time: str) -> Optional[str]:
    """The second after `time` (``YYYY-MM-DDTHH:MM:SSZ``, as the API server writes times), in
    the same form; ``None`` for anything else."""
    b = time.encode("utf-8", "surrogatepass")
    if len(b) != 20 or b[4:5] != b"-" or b[7:8] != b"-" or b[10:11] != b"T":
        return None
    if b[13:14] != b":" or b[16:17] != b":" or b[19:20] != b"Z":
        return None
    try:
        parts = [
            b[r0:r1].decode("ascii")
            for r0, r1 in ((0, 4), (5, 7), (8, 10), (11, 13), (14, 16), (17, 19))
        ]
    except UnicodeDecodeError:
        return None
    numbers = [_num(p) for p in parts]
    if any(n is None for n in numbers):
        return None
    year, month, day, hour, minute, second = numbers
    if not (1 <= month <= 12 and 1 <= day <= 31 and hour <= 23 and minute <= 59 and second <= 60):
        return None
    seconds = _days_from_civil(year, month, day) * 86_400 + hour * 3600 + minute * 60 + second + 1
    days, rest = divmod(seconds, 86_400)
    year, month, day = _civil_from_days(days)
    return f"{year:04}-{month:02}-{day:02}T{rest // 3600:02}:{rest % 3600 // 60:02}:{rest % 60:02}Z"


def _days_from_civil(year: int, month: int, day: int) -> int:
    """Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm)."""
    year = year - 1 if month <= 2 else year
    era = year // 400
    yoe = year - era * 400
    doy = (153 * (month + (-3 if month > 2 else 9)) + 2) // 5 + day - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146_097 + doe - 719_468


def _civil_from_days(days: int):
    """The date of a day count since 1970-01-01 (the inverse of :func:`_days_from_civil`)."""
    z = days + 719_468
    era = z // 146_097
    doe = z - era * 146_097
    yoe = (doe - doe // 1460 + doe // 36_524 - doe // 146_096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    day = doy - (153 * mp + 2) // 5 + 1
    month = mp + 3 if mp < 10 else mp - 9
    return yoe + era * 400 + (1 if month <= 2 else 0), month, day


def data_changed_at(config_map: Any) -> Optional[str]:
    """When ``data`` or ``binaryData`` last changed, as the API server recorded it: the latest
    ``time`` of a ``managedFields`` entry that owns either. ``None`` when no entry says."""
    metadata = config_map.get("metadata") if isinstance(config_map, dict) else None
    entries = metadata.get("managedFields") if isinstance(metadata, dict) else None
    if not isinstance(entries, list):
        return None
    times = []
    for entry in entries:
        if not isinstance(entry, dict):
            continue
        fields = entry.get("fieldsV1")
        if not isinstance(fields, dict) or not ("f:data" in fields or "f:binaryData" in fields):
            continue
        time = entry.get("time")
        if isinstance(time, str):
            times.append(time)
    # RFC 3339 in UTC with a fixed format: text order is time order.
    return max(times) if times else None


def parse_selector(selector: str) -> Selector:
    """A selector the guest is willing to delete by: valid, and not empty (which would select
    every Pod in the namespace). Raises ``ValueError`` saying why not."""
    try:
        parsed = Selector.parse(selector)
    except SelectorError as e:
        raise ValueError(
            f"annotation {SELECTOR_ANNOTATION}: {e}; no Pods will be restarted until it is fixed"
        ) from None
    if parsed.is_empty():
        raise ValueError(
            f"annotation {SELECTOR_ANNOTATION} is empty, which would select every Pod in the "
            "namespace; no Pods will be restarted"
        )
    return parsed


def data_digest(config_map: Any) -> str:
    """``sha256:<hex>`` over a canonical form of ``data`` and ``binaryData``: every entry as
    ``[section, key, value]``, sorted, written as compact JSON — byte for byte what the Rust
    guest hashes (serde_json: UTF-8 unescaped, object keys sorted), so the two guests agree on
    every saved digest."""
    entries = []
    for section in ("data", "binaryData"):
        values = config_map.get(section) if isinstance(config_map, dict) else None
        if isinstance(values, dict):
            entries.extend([section, key, value] for key, value in values.items())
    entries.sort(key=lambda entry: (entry[0], entry[1]))
    canonical = json.dumps(entries, ensure_ascii=False, separators=(",", ":"), sort_keys=True)
    return "sha256:" + hashlib.sha256(canonical.encode("utf-8")).hexdigest()
