//! Reading Kubernetes YAML files with errors that name the file and the problem.

use std::path::Path;

use anyhow::{Context, bail};
use serde::Deserialize;
use serde_json::Value;

/// Every document in a YAML file (`---` separated; `kind: List` items flattened).
pub fn read_objects(path: &Path) -> anyhow::Result<Vec<Value>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read `{}`", path.display()))?;
    let mut objects = Vec::new();
    for (i, doc) in serde_yaml::Deserializer::from_str(&text).enumerate() {
        let value = Value::deserialize(doc).with_context(|| {
            format!(
                "`{}` is not valid YAML (document {})",
                path.display(),
                i + 1
            )
        })?;
        match value {
            Value::Null => {}
            Value::Object(_) if value.get("kind").and_then(Value::as_str) == Some("List") => {
                objects.extend(value["items"].as_array().cloned().unwrap_or_default());
            }
            Value::Object(_) => objects.push(value),
            other => bail!(
                "`{}` document {} is not a Kubernetes object (a YAML mapping), it is `{}`",
                path.display(),
                i + 1,
                other
            ),
        }
    }
    Ok(objects)
}

/// Exactly one object from a file.
pub fn read_object(path: &Path) -> anyhow::Result<Value> {
    let mut objects = read_objects(path)?;
    match objects.len() {
        1 => Ok(objects.remove(0)),
        0 => bail!("`{}` holds no object", path.display()),
        n => bail!(
            "`{}` holds {n} objects; give one object here (more go in --state)",
            path.display()
        ),
    }
}
