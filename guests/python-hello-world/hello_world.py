"""Metacontroller's HelloWorld composite controller as a kubewasm guest, in Python.

``sync()`` is the hook of Metacontroller's "Create a Controller" tutorial
(https://github.com/metacontroller/metacontroller, docs/src/guide/create.md, Apache-2.0), as
close to its code as the contract allows. What changed, and why:

- the hook gets a :class:`kubewasm.Request` and a cluster instead of ``parent`` and
  ``children`` from a webhook body, and answers with a :class:`kubewasm.Response` (apply the
  Pod, then set the status) instead of ``{"status": ..., "children": [...]}``;
- the Pod also says its namespace (the parent's) and carries two labels, and an empty
  ``spec.who`` greets the World too: the same Pod as the Rust guest (guests/hello-world), so
  the two are interchangeable;
- when the HelloWorld is gone there is nothing to do: the host added the controller
  ownerReference to the Pod, and the garbage collector removes it.
"""

import kubewasm

#: Label on every Pod this controller makes, naming its HelloWorld.
HELLO_WORLD_LABEL = "example.com/hello-world"


@kubewasm.reconciler
def sync(request, cluster):
    parent = request.parent
    if parent is None:
        return kubewasm.Response()

    # Compute status based on observed state.
    desired_status = {"pods": len(request.children_of("v1", "Pod"))}

    # Generate the desired child object(s).
    who = parent.get("spec", {}).get("who") or "World"
    desired_pods = [
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": parent["metadata"]["name"],
                "labels": {
                    "app.kubernetes.io/managed-by": "kubewasm",
                    HELLO_WORLD_LABEL: parent["metadata"]["name"],
                },
            },
            "spec": {
                "restartPolicy": "OnFailure",
                "containers": [
                    {
                        "name": "hello",
                        "image": "busybox",
                        "command": ["echo", "Hello, %s!" % who],
                    }
                ],
            },
        }
    ]
    if "namespace" in parent["metadata"]:
        desired_pods[0]["metadata"]["namespace"] = parent["metadata"]["namespace"]

    response = kubewasm.Response()
    for pod in desired_pods:
        response.apply(pod)
    return response.set_status(desired_status)
