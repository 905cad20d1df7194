//! Whose credentials a registry pull uses: none, or a tenant's pull Secret read as the
//! controller's own ServiceAccount, so that RBAC decides whether it may use it.

use k8s_openapi::api::core::v1::Secret;
use oci_client::secrets::RegistryAuth;

use super::oci::{PullError, docker_config_auth};
use kubewasm_api::Reason;

/// Whose credentials a pull uses.
#[derive(Clone)]
pub enum Credentials {
    /// None.
    Anonymous,
    /// A `kubernetes.io/dockerconfigjson` Secret, read with `client` (which acts as the
    /// controller's ServiceAccount `account`).
    Secret {
        /// A client impersonating the ServiceAccount.
        client: kube::Client,
        /// The Secret's (and the ServiceAccount's) namespace.
        namespace: String,
        /// The Secret's name.
        name: String,
        /// The ServiceAccount's name.
        account: String,
    },
}

impl Credentials {
    /// What the credentials are, to tell a changed spec from an unchanged one.
    pub(super) fn describe(&self) -> String {
        match self {
            Credentials::Anonymous => String::new(),
            Credentials::Secret {
                namespace,
                name,
                account,
                ..
            } => format!("{namespace}/{name} as {account}"),
        }
    }

    /// The registry credentials, read from the Secret as the ServiceAccount.
    pub(super) async fn registry_auth(&self, registry: &str) -> Result<RegistryAuth, PullError> {
        let Credentials::Secret {
            client,
            namespace: ns,
            name,
            account,
        } = self
        else {
            return Ok(RegistryAuth::Anonymous);
        };
        let refuse = |reason, message| Err(PullError::PullSecret { reason, message });
        let api: kube::Api<Secret> = kube::Api::namespaced(client.clone(), ns);
        let secret = match api.get(name).await {
            Ok(secret) => secret,
            Err(kube::Error::Api(e)) if e.code == 403 => {
                return refuse(
                    Reason::Forbidden,
                    format!(
                        "ServiceAccount {ns}/{account} may not get Secret {ns}/{name} (spec.module.imagePullSecret), and the runtime reads it as that account: {}; its owner allows it with `kubectl -n {ns} create role {name}-reader --verb=get --resource=secrets --resource-name={name}` and `kubectl -n {ns} create rolebinding {name}-reader --role={name}-reader --serviceaccount={ns}:{account}`",
                        kubewasm_sandbox::guest_text(&e.message, 300)
                    ),
                );
            }
            Err(kube::Error::Api(e)) if e.code == 404 => {
                return refuse(
                    Reason::ModuleNotFound,
                    format!(
                        "Secret {ns}/{name} (spec.module.imagePullSecret) does not exist; create it with `kubectl -n {ns} create secret docker-registry {name} --docker-server={registry} --docker-username=USER --docker-password=PASSWORD`"
                    ),
                );
            }
            Err(e) => {
                return refuse(
                    Reason::ClientError,
                    format!("cannot read Secret {ns}/{name} (spec.module.imagePullSecret): {e}"),
                );
            }
        };
        let invalid = |why: String| {
            refuse(
                Reason::InvalidSpec,
                format!("Secret {ns}/{name} (spec.module.imagePullSecret) {why}"),
            )
        };
        if secret.type_.as_deref() != Some("kubernetes.io/dockerconfigjson") {
            return invalid(format!(
                "is of type {}, not kubernetes.io/dockerconfigjson; make it with `kubectl create secret docker-registry`",
                secret.type_.as_deref().unwrap_or("Opaque")
            ));
        }
        let Some(json) = secret
            .data
            .as_ref()
            .and_then(|d| d.get(".dockerconfigjson"))
        else {
            return invalid("has no key .dockerconfigjson".into());
        };
        match docker_config_auth(&json.0, registry) {
            Ok(Some(auth)) => Ok(auth),
            Ok(None) => invalid(format!("has no credentials for registry {registry}")),
            Err(why) => invalid(why),
        }
    }
}
