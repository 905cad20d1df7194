//! Reads and logging a guest may use while reconciling, behind a trait so that native tests
//! can hand the guest a fake cluster (`testing::FakeCluster`, native only).

use serde_json::Value;

use crate::Error;

/// Severity of a log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum LogLevel {
    /// Very detailed tracing.
    Trace,
    /// Debugging detail.
    Debug,
    /// Normal operation.
    Info,
    /// Something unexpected that was handled.
    Warn,
    /// Something failed.
    Error,
}

/// The cluster as a guest sees it: the runtime's shared cache, limited to the kinds the
/// controller declared. Reads the host refuses come back as retryable [`Error`]s, so a `?`
/// makes the host back off and try again.
pub trait Cluster {
    /// Read one object; `Ok(None)` when it does not exist. `namespace: None` means the
    /// target's namespace for namespaced kinds.
    fn get(
        &self,
        api_version: &str,
        kind: &str,
        namespace: Option<&str>,
        name: &str,
    ) -> Result<Option<Value>, Error>;

    /// List objects of one kind in one namespace (`None`: the target's namespace for
    /// namespaced kinds), optionally filtered by a label selector such as `app=web`.
    fn list(
        &self,
        api_version: &str,
        kind: &str,
        namespace: Option<&str>,
        label_selector: Option<&str>,
    ) -> Result<Vec<Value>, Error>;

    /// Write a log line, tagged by the host with the controller and the target.
    fn log(&self, level: LogLevel, message: &str);

    /// Log at [`LogLevel::Debug`].
    fn debug(&self, message: &str) {
        self.log(LogLevel::Debug, message);
    }

    /// Log at [`LogLevel::Info`].
    fn info(&self, message: &str) {
        self.log(LogLevel::Info, message);
    }

    /// Log at [`LogLevel::Warn`].
    fn warn(&self, message: &str) {
        self.log(LogLevel::Warn, message);
    }
}
