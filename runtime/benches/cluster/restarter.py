"""The Python ConfigMap restarter of the magalix.com tutorial ("Extending the Kubernetes
Controller"), for `runtime/benches/cluster.rs`: the same loop, on the official `kubernetes`
client instead of `requests` through a `kubectl proxy` sidecar.

The tutorial watches the ConfigMaps of one namespace (`res_namespace`); on every MODIFIED event
of a ConfigMap annotated `magalix.com/podDeleteMatch`, it lists the Pods matching the
annotation's label selector and deletes them one by one. Like the tutorial it is event-based
(no state, no check that the data changed) and logs one line per event and per deleted Pod
(the benchmark waits for the first event: then it is watching). Credentials come
from KUBECONFIG (the tutorial's ServiceAccount `joe`), where the tutorial read the mounted
token.
"""

import logging
import os
import sys

from kubernetes import client, config, watch

ANNOTATION = "magalix.com/podDeleteMatch"

log = logging.getLogger("restarter")
handler = logging.StreamHandler(sys.stdout)
handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
log.addHandler(handler)
log.setLevel(logging.INFO)

config.load_kube_config()
core = client.CoreV1Api()
namespace = os.getenv("res_namespace", "default")


def kill_pods(label):
    """Deletes every Pod of the namespace that matches the label selector."""
    pods = core.list_namespaced_pod(namespace, label_selector=label)
    for name in [p.metadata.name for p in pods.items]:
        try:
            core.delete_namespaced_pod(name, namespace)
            log.info("%s was deleted successfully", name)
        except client.ApiException as error:
            log.error("could not delete %s: %s", name, error.reason)


def event_loop():
    log.info("watching the ConfigMaps of namespace %s", namespace)
    label = None
    for event in watch.Watch().stream(core.list_namespaced_config_map, namespace):
        log.info("%s %s", event["type"], event["object"].metadata.name)
        annotations = event["object"].metadata.annotations or {}
        if ANNOTATION in annotations:
            label = annotations[ANNOTATION]
        if event["type"] == "MODIFIED" and label:
            log.info("modification detected on %s", event["object"].metadata.name)
            kill_pods(label)


event_loop()
