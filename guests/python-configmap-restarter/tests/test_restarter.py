"""The ConfigMap restarter's reconcile against fixtures, natively: the Rust guest's tests
(guests/configmap-restarter/tests/restarter.rs) on the Rust guest's fixtures, with the same
pinned digests, so the two guests behave — and save state — alike."""

import pathlib

import pytest
from configmap_restarter import (
    Pending,
    data_changed_at,
    data_digest,
    next_second,
    pending_bound,
    pending_state,
    reconcile,
)
from kubewasm import DeleteAllOf, Event, EventType, ObjectRef, Request, SetState, objects
from kubewasm.selector import Selector
from kubewasm.testing import FakeCluster, object_from_yaml, request_from_yaml

FIXTURES = (
    pathlib.Path(__file__).resolve().parents[2] / "configmap-restarter" / "tests" / "fixtures"
)

#: Digest of `app.conf: "color=blue\n"` — the Rust guest's pinned value. Changing the digest
#: would restart every user's Pods once.
BLUE_DIGEST = "sha256:91972207f1577170f617d6835b9add1d1d592d4cb6bc5468fd1abe92e5527d26"
#: Digest of the blue data plus `binaryData.logo.png`.
BLUE_WITH_LOGO_DIGEST = "sha256:f967b655df831e910459d8f963796ab987b39c9854a7cad0b36d1a0bf16a4584"


def fixture(name):
    return object_from_yaml((FIXTURES / name).read_text())


def pod(name, namespace, app, created=None):
    metadata = {"name": name, "namespace": namespace, "labels": {"app": app}}
    if created is not None:
        metadata["creationTimestamp"] = created
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata}


def pods():
    """The two `app=frontend` Pods of namespace `demo` made before the data changed
    (12:00:05), and others that do not match."""
    cluster = FakeCluster()
    for name, namespace, app, created in [
        ("frontend-1", "demo", "frontend", "2026-11-23T12:00:01Z"),
        ("frontend-2", "demo", "frontend", "2026-11-23T12:00:03Z"),
        ("backend-1", "demo", "backend", "2026-11-23T12:00:09Z"),
        ("frontend-elsewhere", "other", "frontend", "2026-11-23T12:00:09Z"),
    ]:
        cluster.insert(pod(name, namespace, app, created))
    return cluster


def run_in(cluster, config_map, saved):
    request = Request.for_object(config_map)
    if saved is not None:
        request = request.with_state(saved)
    return reconcile(request, cluster)


def run_with(config_map, saved):
    return run_in(pods(), config_map, saved)


def run(config_map):
    """As last restarted for the blue data."""
    return run_with(config_map, BLUE_DIGEST)


def restart_event(before):
    return Event(
        EventType.NORMAL,
        "PodsRestarted",
        "ConfigMap data changed: deleted the Pods in namespace demo matching "
        f'"app=frontend", created before {before}',
    )


def delete_created_before(before):
    return DeleteAllOf("v1", "Pod", "demo", "app=frontend", before)


def test_first_sighting_saves_the_digest_only():
    response = run_with(fixture("first-sighting.yaml"), None)
    assert response.actions == [SetState(BLUE_DIGEST)]


def test_changed_data_restarts_the_pods_of_the_old_data_then_saves():
    config_map = fixture("data-changed.yaml")
    green = data_digest(config_map)
    assert green != BLUE_DIGEST
    assert run(config_map).actions == [
        # The data's last writer (kubectl-patch, 12:00:05) is later than both Pods.
        SetState(pending_state(green, "2026-11-23T12:00:05Z")),
        delete_created_before("2026-11-23T12:00:06Z"),
        SetState(green),
        restart_event("2026-11-23T12:00:06Z"),
    ]
    # Once the host has saved the state, the same data restarts nothing.
    assert run_with(config_map, green).is_empty()


def test_a_second_change_by_the_same_manager_restarts_the_replacements_of_the_first():
    config_map = fixture("data-changed.yaml")
    green = data_digest(config_map)
    cluster = pods()
    cluster.insert(pod("frontend-3", "demo", "frontend", "2026-11-23T12:10:00Z"))
    response = run_in(cluster, config_map, BLUE_DIGEST)
    assert response.actions[:2] == [
        SetState(pending_state(green, "2026-11-23T12:10:00Z")),
        delete_created_before("2026-11-23T12:10:01Z"),
    ]


def test_an_unfinished_restart_deletes_up_to_its_saved_bound_only():
    # Killed (or a delete refused) after `pending:` was saved, before the digest was: the
    # replacements made since are newer than the saved bound, and spared. No read is needed.
    config_map = fixture("data-changed.yaml")
    green = data_digest(config_map)
    saved = pending_state(green, "2026-11-23T12:00:03Z")
    with_replacement = pods()
    with_replacement.insert(pod("frontend-new", "demo", "frontend", "2026-11-23T12:00:30Z"))
    for cluster in [with_replacement, FakeCluster().refusing_reads("no reads granted")]:
        assert run_in(cluster, config_map, saved).actions == [
            delete_created_before("2026-11-23T12:00:04Z"),
            SetState(green),
            restart_event("2026-11-23T12:00:04Z"),
        ]
    # A pending restart for other data is a new change.
    response = run_with(config_map, pending_state(BLUE_DIGEST, "2026-11-23T11:00:00Z"))
    assert response.actions[1] == delete_created_before("2026-11-23T12:00:06Z")


def test_pending_states_parse_back():
    bound = "2026-11-23T12:00:05Z"
    assert pending_bound(pending_state("sha256:ab", bound), "sha256:ab") == Pending(bound)
    assert pending_bound(pending_state("sha256:ab", None), "sha256:ab") == Pending(None)
    assert pending_bound(pending_state("sha256:ab", bound), "sha256:cd") is None
    assert pending_bound("sha256:ab", "sha256:ab") is None
    assert pending_bound("pending:sha256:abc", "sha256:ab") is None


@pytest.mark.parametrize(
    "time, following",
    [
        ("2026-11-23T12:00:05Z", "2026-11-23T12:00:06Z"),
        ("2026-12-31T23:59:59Z", "2027-01-01T00:00:00Z"),
        ("2024-02-28T23:59:59Z", "2024-02-29T00:00:00Z"),
        ("2023-02-28T23:59:59Z", "2023-03-01T00:00:00Z"),
        ("1970-01-01T00:00:00Z", "1970-01-01T00:00:01Z"),
    ],
)
def test_the_second_after_a_time(time, following):
    assert next_second(time) == following


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "2026-11-23T12:00:05",
        "2026-11-23 12:00:05Z",
        "2026-13-23T12:00:05Z",
        "2026-11-23T12:00:05.5Z",
        "2026-11-23T12:00:0éZ",
    ],
)
def test_not_a_time(bad):
    assert next_second(bad) is None


def test_without_managed_fields_the_newest_pod_bounds_the_restart():
    config_map = fixture("data-changed.yaml")
    del config_map["metadata"]["managedFields"]
    assert data_changed_at(config_map) is None
    assert run(config_map).actions[1] == delete_created_before("2026-11-23T12:00:04Z")
    # With no Pod and no time of the change, or a Pod without a creation time: not bounded.
    green = data_digest(config_map)
    undated = FakeCluster()
    undated.insert(pod("frontend-1", "demo", "frontend"))
    for cluster in [FakeCluster(), undated]:
        assert run_in(cluster, config_map, BLUE_DIGEST).actions[:2] == [
            SetState(pending_state(green, None)),
            DeleteAllOf("v1", "Pod", "demo", "app=frontend"),
        ]


def test_the_selector_picks_the_pods_of_the_configmaps_namespace():
    action = run(fixture("data-changed.yaml")).actions[1]
    assert isinstance(action, DeleteAllOf), action
    cluster = FakeCluster.from_yaml((FIXTURES / "pods.yaml").read_text())
    selector = Selector.parse(action.label_selector)
    doomed = cluster.list("v1", "Pod", action.namespace, str(selector))
    assert [objects.name(p) for p in doomed] == ["frontend-1", "frontend-2"]


def test_same_digest_does_nothing():
    assert run(fixture("first-sighting.yaml")).is_empty()


def test_metadata_only_change_restarts_nothing():
    response = run(fixture("metadata-changed.yaml"))
    assert response.is_empty(), response


def test_unannotated_configmap_is_ignored():
    assert run(fixture("unannotated.yaml")).is_empty()


def test_deleted_configmap_needs_nothing():
    # Its saved state is forgotten by the runtime once the object is gone.
    request = Request.gone(ObjectRef("v1", "ConfigMap", "demo", "app-config"))
    assert reconcile(request, FakeCluster()).is_empty()
    terminating = fixture("data-changed.yaml")
    terminating["metadata"]["deletionTimestamp"] = "2024-01-01T00:00:00Z"
    assert run(terminating).is_empty()


@pytest.mark.parametrize(
    "name, needle",
    [
        ("bad-selector.yaml", 'invalid label selector "app in (frontend"'),
        ("empty-selector.yaml", "would select every Pod"),
    ],
)
def test_invalid_selector_warns_and_does_nothing_else(name, needle):
    response = run(fixture(name))
    assert len(response.actions) == 1, response
    ((kind, reason, message),) = response.events()
    assert kind is EventType.WARNING
    assert reason == "InvalidSelector"
    assert needle in message
    assert "magalix.com/podDeleteMatch" in message


def test_digest_covers_binary_data_and_ignores_key_order():
    assert data_digest(fixture("with-binary-data.yaml")) == BLUE_WITH_LOGO_DIGEST
    reordered = {"data": {"b": "2", "a": "1"}, "binaryData": {"z": "AA=="}}
    ordered = {"binaryData": {"z": "AA=="}, "data": {"a": "1", "b": "2"}}
    assert data_digest(reordered) == data_digest(ordered)
    # A key moved between data and binaryData is a change.
    assert data_digest({"data": {"k": "AA=="}}) != data_digest({"binaryData": {"k": "AA=="}})
    # No data and empty data are the same thing.
    assert data_digest({}) == data_digest({"data": {}})


def test_pinned_digest_of_the_blue_data():
    assert data_digest(fixture("first-sighting.yaml")) == BLUE_DIGEST


def test_digest_of_text_serde_json_would_escape():
    """serde_json writes non-ASCII as UTF-8 and escapes control characters as \\n, \\u001f:
    the canonical bytes, spelled out."""
    import hashlib

    config_map = {"data": {"k": 'é\n\x1f"\\'}}
    canonical = '[["data","k","é\\n\\u001f\\"\\\\"]]'.encode("utf-8")
    assert data_digest(config_map) == "sha256:" + hashlib.sha256(canonical).hexdigest()


def test_a_refused_read_of_the_pods_fails_the_reconcile_saying_why():
    request = request_from_yaml((FIXTURES / "data-changed.yaml").read_text()).with_state(
        BLUE_DIGEST
    )
    with pytest.raises(Exception) as err:
        reconcile(request, FakeCluster().refusing_reads("no reads granted"))
    assert "no reads granted" in str(err.value)
    assert err.value.retryable
