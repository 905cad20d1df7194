//! Granted objects of other kinds: delete one, or every one matching a label selector (their
//! apply is the plain server-side apply in the parent module).

use futures::StreamExt as _;
use kube::Api;
use kube::api::{DeleteParams, DynamicObject, ListParams};
use kubewasm_guest_sdk::query;
use kubewasm_guest_sdk::selector::Selector;
use serde_json::Value;

use crate::api::Verb;
use crate::sandbox::{ObjectRef, parse_time};

use super::{ActionError, Executor, Outcome};

/// Deletes of one delete-by-selector under way at once (the matching objects are independent,
/// and one after another each waits a round trip for the one before).
const DELETES_IN_FLIGHT: usize = 8;

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
            Ok(_) => outcome.written(format!("deleted {what}"), None, false),
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
        let doomed: Vec<Value> = found
            .items
            .into_iter()
            .filter(|object| {
                // Strictly earlier: objects made in the same second as `before` (the API
                // server keeps seconds) are taken to be newer.
                let created = object.metadata.creation_timestamp.as_ref().map(|t| t.0);
                before.is_none_or(|before| created.is_some_and(|c| c < before))
            })
            .map(|object| serde_json::to_value(&object).unwrap_or(Value::Null))
            .collect();
        // Deleted [`DELETES_IN_FLIGHT`] at a time: each still takes its turn in the write
        // scheduler and passes the fence, and a failure fails the action once the deletes
        // under way are answered.
        let namespace = namespace.as_deref();
        let deletes: Vec<_> = doomed
            .iter()
            .map(|value| async move {
                let mut done = Outcome::default();
                self.delete_object(kind, namespace, value, &mut done)
                    .await
                    .map(|_| done.changes)
            })
            .collect();
        let deleted: Vec<Result<Vec<String>, ActionError>> = futures::stream::iter(deletes)
            .buffer_unordered(DELETES_IN_FLIGHT)
            .collect()
            .await;
        for changes in deleted {
            let changes = changes?;
            outcome.wrote |= !changes.is_empty();
            outcome.changes.extend(changes);
        }
        Ok(())
    }
}
