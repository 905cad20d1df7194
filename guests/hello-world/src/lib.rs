//! Metacontroller's HelloWorld composite controller as a kubewasm guest.
//!
//! For each `HelloWorld` (`example.com/v1`) the desired state is one Pod, named like the
//! parent and in its namespace, that prints `Hello, <spec.who>!` once (`spec.who` defaults
//! to `World`; the word `Hello` is [`GREETING`], which a build can change). The status counts the Pods observed as children. The host adds the controller
//! ownerReference to the Pod, so when the parent is gone there is nothing to do: the garbage
//! collector removes the Pod.

use kubewasm_guest_sdk::{Cluster, Error, Request, Response, object};
use serde_json::json;

/// The greeting's first word: `Hello`, or `$HELLO_WORLD_GREETING` at build time. `make demo`
/// builds a second module with `Howdy` to show a moved image tag changing what runs.
pub const GREETING: &str = match option_env!("HELLO_WORLD_GREETING") {
    Some(greeting) => greeting,
    None => "Hello",
};

/// Who is greeted when `spec.who` is missing or empty.
pub const DEFAULT_WHO: &str = "World";

/// Label on every Pod this controller makes, naming its HelloWorld.
pub const HELLO_WORLD_LABEL: &str = "example.com/hello-world";

/// Desired state of one HelloWorld: its Pod and its status.
pub fn reconcile(req: &Request, _cluster: &dyn Cluster) -> Result<Response, Error> {
    let Some(parent) = &req.parent else {
        return Ok(Response::new());
    };
    let who = object::spec_str(parent, "who")
        .filter(|who| !who.is_empty())
        .unwrap_or(DEFAULT_WHO);
    let name = &req.target.name;
    let pod = object::child_of(parent, "v1", "Pod", name)
        .label("app.kubernetes.io/managed-by", "kubewasm")
        .label(HELLO_WORLD_LABEL, name)
        .spec(json!({
            "restartPolicy": "OnFailure",
            "containers": [{
                "name": "hello",
                "image": "busybox",
                "command": ["echo", format!("{GREETING}, {who}!")],
            }],
        }));
    let pods = req.children_of("v1", "Pod").count();
    Ok(Response::new()
        .apply(pod)
        .set_status(json!({ "pods": pods })))
}

kubewasm_guest_sdk::export_reconciler!(reconcile);
