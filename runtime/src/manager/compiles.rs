//! Compiles beside the manager loop. A new module is compiled in a child process
//! ([`crate::sandbox::ChildCompiler`]) that may take as long as its CPU limit allows; the loop
//! does not wait for it: reading the module answers [`Compiling`](super::modules) at once, the
//! compile runs on a blocking thread, and the loop is handed the result
//! ([`Manager::on_compiled`](super::Manager)) with every controller that asked for that module
//! meanwhile. One compile per digest: a controller whose module is being compiled joins it
//! (and costs its namespace's compile budget nothing).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::mpsc;

use crate::sandbox::{Digest, GuestPre, LoadError, Sandbox};
use crate::sources::Version;
use crate::sync::Locks as _;

use super::ControllerId;

/// A controller waiting for a compile: what it read its module as.
pub(super) struct Waiter {
    /// The controller.
    pub id: ControllerId,
    /// The version of its source the bytes came from.
    pub version: Version,
    /// The anonymous pinned image it shares, if it does (see `shared_images`).
    pub shared: Option<String>,
}

/// A compile that ended, and the controllers that waited for it.
pub(super) struct Compiled {
    /// The module's digest.
    pub digest: Digest,
    /// The module, or why not.
    pub result: Result<Arc<GuestPre>, LoadError>,
    /// Who asked for it while it ran.
    pub waiters: Vec<Waiter>,
}

/// The compiles under way, by digest, with their waiters.
pub(super) struct Compiles {
    waiting: Arc<Mutex<HashMap<Digest, Vec<Waiter>>>>,
    done: mpsc::UnboundedSender<Compiled>,
    /// Taken by the manager loop when it starts.
    ended: Mutex<Option<mpsc::UnboundedReceiver<Compiled>>>,
}

impl Compiles {
    pub(super) fn new() -> Compiles {
        let (done, ended) = mpsc::unbounded_channel();
        Compiles {
            waiting: Arc::default(),
            done,
            ended: Mutex::new(Some(ended)),
        }
    }

    /// The ends of compiles, for the manager loop (once).
    pub(super) fn ended(&self) -> Option<mpsc::UnboundedReceiver<Compiled>> {
        self.ended.locked().take()
    }

    /// Adds `waiter` to the compile of `digest` if one is under way (once per controller: a
    /// controller that reads its module again while it compiles waits once, with its latest
    /// read); else gives it back.
    pub(super) fn join(&self, digest: Digest, waiter: Waiter) -> Result<(), Waiter> {
        match self.waiting.locked().get_mut(&digest) {
            Some(waiters) => {
                waiters.retain(|w| w.id != waiter.id);
                waiters.push(waiter);
                Ok(())
            }
            None => Err(waiter),
        }
    }

    /// Compiles `bytes` (of `digest`) on a blocking thread for `waiter` and whoever joins; the
    /// loop is handed the result. At most one compile per digest (callers [`Compiles::join`]
    /// first); the sandbox compiles one module at a time.
    pub(super) fn start(
        &self,
        sandbox: Sandbox,
        bytes: impl AsRef<[u8]> + Send + 'static,
        digest: Digest,
        waiter: Waiter,
    ) {
        self.waiting.locked().insert(digest, vec![waiter]);
        let waiting = self.waiting.clone();
        let done = self.done.clone();
        tokio::spawn(async move {
            let result = tokio::task::spawn_blocking(move || sandbox.load(bytes.as_ref()))
                .await
                .unwrap_or_else(|e| {
                    Err(LoadError::Engine(wasmtime::Error::msg(format!(
                        "the compile's thread failed: {e}"
                    ))))
                });
            let waiters = waiting.locked().remove(&digest).unwrap_or_default();
            // The loop is gone only when the runtime stops.
            let _ = done.send(Compiled {
                digest,
                result,
                waiters,
            });
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn waiter(name: &str) -> Waiter {
        Waiter {
            id: ControllerId {
                namespace: Some("ns".into()),
                name: name.into(),
            },
            version: Version::Image("sha256:00".into()),
            shared: None,
        }
    }

    #[tokio::test]
    async fn a_compile_is_shared_by_who_joins_it_and_handed_to_the_loop() {
        let compiles = Compiles::new();
        let mut ended = compiles.ended().expect("the loop's end");
        assert!(compiles.ended().is_none(), "once");
        let digest = Digest::of(b"not wasm");
        assert!(
            compiles.join(digest, waiter("first")).is_err(),
            "none under way"
        );
        let sandbox = Sandbox::new(crate::sandbox::SandboxConfig {
            max_instances: 1,
            ..Default::default()
        })
        .expect("a sandbox");
        // Joined before the blocking thread runs: the loop is not awaited by the test.
        compiles.start(sandbox, b"not wasm".to_vec(), digest, waiter("first"));
        let joined = compiles.join(digest, waiter("second"));
        let compiled = ended.recv().await.expect("the compile ends");
        assert_eq!(compiled.digest, digest);
        assert!(matches!(compiled.result, Err(LoadError::NotWasm)));
        let names: Vec<&str> = compiled
            .waiters
            .iter()
            .map(|w| w.id.name.as_str())
            .collect();
        match joined {
            Ok(()) => assert_eq!(names, ["first", "second"]),
            Err(_) => assert_eq!(names, ["first"], "ended before the join: not joined"),
        }
        assert!(
            compiles.join(digest, waiter("third")).is_err(),
            "ended: none under way"
        );
        // A controller that reads again while its module compiles waits once.
        compiles
            .waiting
            .locked()
            .insert(digest, vec![waiter("again")]);
        assert!(compiles.join(digest, waiter("again")).is_ok());
        assert!(compiles.join(digest, waiter("other")).is_ok());
        let names: Vec<String> = compiles.waiting.locked()[&digest]
            .iter()
            .map(|w| w.id.name.clone())
            .collect();
        assert_eq!(names, ["again", "other"]);
    }
}
