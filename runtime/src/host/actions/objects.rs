//! Granted objects of other kinds: delete one, or every one matching a label selector (their
//! apply is the plain server-side apply in the parent module).

use kube::Api;
use kube::api::{DeleteParams, DynamicObject, ListParams};
use kubewasm_guest_sdk::query;
use kubewasm_guest_sdk::selector::Selector;
use serde_json::Value;

use crate::api::Verb;
use crate::sandbox::{ObjectRef, parse_time};

use super::{ActionError, Executor, Outcome};

impl Executor<'_> {
    pub(super) async fn delete_one(
        &self,
        r: &ObjectRef,
        outcome: &mut Outcome,
    ) -> Result<(), ActionError> {
        query::validate_name(&r.name).map_err(|e| ActionError::Invalid(e.to_string()))?;
        let (kind, namespace) = self.resolve(Verb::Delete, r)?;
        self.permissions
            .check(Verb::Delete, &r.api_version, &r.kind, namespace.as_deref())?;
        let api = kind.api(self.client.clone(), namespace.as_deref());
        let what = ObjectRef {
            namespace,
            ..r.clone()
        };
        self.may_write().await?;
        match api.delete(&r.name, &DeleteParams::background()).await {
            Ok(_) => outcome.changes.push(format!("deleted {what}")),
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(source) => {
                return Err(ActionError::Api {
                    what: format!("delete {what}"),
                    source,
                });
            }
        }
        Ok(())
    }

    pub(super) async fn delete_matching(
        &self,
        r: &ObjectRef,
        selector: &str,
        created_before: Option<&str>,
        outcome: &mut Outcome,
    ) -> Result<(), ActionError> {
        let before = created_before
            .map(parse_time)
            .transpose()
            .map_err(ActionError::Invalid)?;
        Selector::parse(selector).map_err(|e| {
            ActionError::Invalid(format!("invalid label selector `{selector}`: {e}"))
        })?;
        let (kind, namespace) = self.resolve(Verb::Delete, r)?;
        self.permissions
            .check(Verb::Delete, &r.api_version, &r.kind, namespace.as_deref())?;
        let api: Api<DynamicObject> = kind.api(self.client.clone(), namespace.as_deref());
        self.may_write().await?;
        let found = api
            .list(&ListParams::default().labels(selector))
            .await
            .map_err(|source| ActionError::Api {
                what: format!("list {} matching `{selector}`", r.kind),
                source,
            })?;
        for object in found.items {
            // Strictly earlier: objects made in the same second as `before` (the API server
            // keeps seconds) are taken to be newer.
            let created = object.metadata.creation_timestamp.as_ref().map(|t| t.0);
            if let Some(before) = before
                && created.is_none_or(|c| c >= before)
            {
                continue;
            }
            let value = serde_json::to_value(&object).unwrap_or(Value::Null);
            self.delete_object(kind, namespace.as_deref(), &value, outcome)
                .await?;
        }
        Ok(())
    }
}
