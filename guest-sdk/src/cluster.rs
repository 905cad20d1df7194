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

/// The reads a guest makes: one signature on both sides of the WIT boundary. Implemented in
/// the guest by the host imports, in native tests by `testing::FakeCluster`, and in the
/// runtime by the reads it grants a controller (from its shared cache). Every implementation
/// refuses the same things the same way: an invalid name, namespace or selector, or a kind
/// the controller may not read, is a permanent [`Error`].
pub trait Reads {
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
}

/// The cluster as a guest sees it: the runtime's shared cache, limited to the kinds the
/// controller declared ([`Reads`]), and the host's log.
pub trait Cluster: Reads {
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
