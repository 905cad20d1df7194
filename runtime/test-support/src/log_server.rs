//! The runtime's log server under test (`kubewasm run --api-addr`): the RBAC of
//! `deploy/runtime/logs.yaml`, and its APIService pointed at a runtime process on this machine.
//! Kubernetes refuses loopback and link-local Endpoints, so the runtime listens on this
//! machine's first other address and a selector-less Service's Endpoints name it. An
//! APIService is cluster-wide: one test per control plane may expose a runtime.

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use kube::api::{Api, DynamicObject, PostParams};
use kube::discovery::ApiResource;
use serde_json::{Value, json};

use super::{ControlPlane, apply_all, documents, eventually};

/// The APIService of `deploy/runtime/logs.yaml`.
pub const LOGS_API_SERVICE: &str = "v1alpha1.logs.kubewasm.dev";

/// How long the aggregator may take to find the log server available.
const AVAILABLE: Duration = Duration::from_secs(60);

/// The documents of `deploy/runtime/logs.yaml` of this checkout.
pub fn logs_manifest() -> Result<Vec<Value>> {
    let file = super::workspace().join("deploy/runtime/logs.yaml");
    let yaml = std::fs::read_to_string(&file).with_context(|| format!("{}", file.display()))?;
    documents(&yaml)
}

/// Its RBAC only (what the runtime and the teams need), without the APIService and Service
/// that point at a Deployment's Pods.
pub fn logs_rbac() -> Result<Vec<Value>> {
    Ok(logs_manifest()?
        .into_iter()
        .filter(|d| {
            matches!(
                d["kind"].as_str(),
                Some("ClusterRole" | "ClusterRoleBinding" | "RoleBinding" | "Role")
            )
        })
        .collect())
}

/// This machine's first address that Endpoints may hold (not loopback, not link-local), as
/// `hostname -I` lists them.
pub fn host_address() -> Result<IpAddr> {
    let out = std::process::Command::new("hostname")
        .arg("-I")
        .output()
        .context("running hostname -I")?;
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .filter_map(|a| a.parse::<IpAddr>().ok())
        .find(|ip| match ip {
            IpAddr::V4(v4) => !v4.is_loopback() && !v4.is_link_local(),
            IpAddr::V6(_) => false,
        })
        .context(
            "this machine has no IPv4 address other than loopback and link-local (hostname -I)",
        )
}

/// A free TCP port on all addresses.
pub fn free_port() -> Result<u16> {
    let listener = std::net::TcpListener::bind("0.0.0.0:0")?;
    Ok(listener.local_addr()?.port())
}

impl ControlPlane {
    /// The front proxy's client certificate and key of a control plane we started.
    pub fn front_proxy_client(&self) -> Option<(PathBuf, PathBuf)> {
        let pki = self.state_dir()?.join("pki");
        Some((
            pki.join("front-proxy-client.crt"),
            pki.join("front-proxy-client.key"),
        ))
    }

    /// Points the APIService of `deploy/runtime/logs.yaml` at a runtime listening on
    /// `ip:port` (a selector-less Service and its Endpoints in kubewasm-system), and waits
    /// until the aggregator finds it available.
    pub async fn expose_log_server(&self, ip: IpAddr, port: u16) -> Result<()> {
        let client = self.client().await?;
        let ns = super::RUNTIME_NAMESPACE;
        let api_service = logs_manifest()?
            .into_iter()
            .find(|d| d["kind"] == "APIService")
            .context("deploy/runtime/logs.yaml has no APIService")?;
        let service = json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "kubewasm-logs", "namespace": ns},
            "spec": {"ports": [{"name": "logs", "port": 443, "targetPort": port, "protocol": "TCP"}]}});
        let endpoints = json!({"apiVersion": "v1", "kind": "Endpoints",
            "metadata": {"name": "kubewasm-logs", "namespace": ns},
            "subsets": [{"addresses": [{"ip": ip.to_string()}],
                "ports": [{"name": "logs", "port": port, "protocol": "TCP"}]}]});
        apply_all(&client, &[service, endpoints]).await?;
        let resource = ApiResource {
            group: "apiregistration.k8s.io".into(),
            version: "v1".into(),
            api_version: "apiregistration.k8s.io/v1".into(),
            kind: "APIService".into(),
            plural: "apiservices".into(),
        };
        let services: Api<DynamicObject> = Api::all_with(client, &resource);
        // Created, not applied: a 1.20 kube-apiserver panics on a server-side apply of an
        // APIService ("FieldManager must be installed to run apply").
        let object: DynamicObject = serde_json::from_value(api_service)?;
        // One that exists already is the same (the Service's port is in its Endpoints).
        match services.create(&PostParams::default(), &object).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 409 => {}
            Err(error) => return Err(error).context("creating the APIService"),
        }
        eventually(
            &format!("APIService {LOGS_API_SERVICE} is Available (the runtime serves https://{ip}:{port})"),
            AVAILABLE,
            || async {
                let service = services.get(LOGS_API_SERVICE).await?;
                let available = service.data["status"]["conditions"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .find(|c| c["type"] == "Available");
                match available {
                    Some(c) if c["status"] == "True" => Ok(Some(())),
                    other => anyhow::bail!("not yet: {other:?}"),
                }
            },
        )
        .await
    }
}
