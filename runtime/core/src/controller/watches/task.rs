//! The task behind one shared watch: applies what kube-runtime's watcher brings to the cache
//! (the reflector's `Writer`, driven here so that objects of held-back namespaces can be
//! dropped, evicted and listed again), keeps the owner index, and announces changes.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use futures::{StreamExt, TryStreamExt};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::broadcast;

use super::super::accounts::{Admit, CacheAccounts, WatchBook};
use super::{Cached, Change, ObjectKey, OwnerIndex, owner_uids, watch_config};
use crate::sync::Locks as _;

/// The task behind one [`Watch`](super::Watch): applies what the watcher brings to the cache, weighing
/// every object against its namespace's account ([`CacheAccounts`]), and announces changes.
pub(super) struct WatchTask {
    pub(super) what: String,
    pub(super) api: kube::Api<Cached>,
    /// The kind watched.
    pub(super) resource: kube::api::ApiResource,
    pub(super) writer: reflector::store::Writer<Cached>,
    pub(super) store: Store<Cached>,
    pub(super) changes: broadcast::Sender<Arc<Change>>,
    pub(super) index: Arc<Mutex<OwnerIndex>>,
    pub(super) accounts: Arc<CacheAccounts>,
    /// What the watch charged for every object it was brought, stored or not; dropped with
    /// the task (aborted or ended), which credits it all.
    pub(super) book: WatchBook,
}

/// A watcher's events, from its first list on.
type Events = std::pin::Pin<
    Box<dyn futures::Stream<Item = Result<watcher::Event<Cached>, watcher::Error>> + Send>,
>;

impl WatchTask {
    fn events(&self) -> Events {
        // Items of a list come without apiVersion and kind; every object gets its kind's.
        let resource = self.resource.clone();
        Box::pin(
            watcher(self.api.clone(), watch_config())
                .default_backoff()
                .map_ok(move |event| event.modify(|o| o.set_type(&resource))),
        )
    }

    pub(super) async fn run(
        mut self,
        mut held: broadcast::Receiver<String>,
        mut readmitted: tokio::sync::watch::Receiver<u64>,
    ) {
        let what = self.what.clone();
        tracing::info!(kind = what.as_str(), "starting shared watch");
        let id = self.book.id();
        let mut stream = self.events();
        let mut listed_at = tokio::time::Instant::now();
        let mut relist_at: Option<tokio::time::Instant> = None;
        // What the cache had before a (re)list, to announce objects that vanished meanwhile;
        // namespaces whose objects this list dropped.
        let mut before_relist: HashSet<ObjectKey> = HashSet::new();
        let mut dropped: HashSet<String> = HashSet::new();
        loop {
            let relist = async {
                match relist_at {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                event = stream.next() => {
                    let Some(event) = event else { return };
                    match event {
                        Ok(watcher::Event::Apply(o)) => self.apply(o),
                        Ok(watcher::Event::Delete(o)) => {
                            let key = ObjectKey::of(&o);
                            self.book.credit(&key);
                            self.index().remove(&key);
                            self.writer.apply_watcher_event(&watcher::Event::Delete(o.clone()));
                            self.send(&o);
                        }
                        Ok(watcher::Event::Init) => {
                            before_relist = self.store.state().iter().map(|o| ObjectKey::of(o)).collect();
                            // Objects charged stay charged until the list is done: a
                            // relisted one is charged in place, not twice.
                            self.book.listing();
                            dropped.clear();
                            self.writer.apply_watcher_event(&watcher::Event::Init);
                        }
                        Ok(watcher::Event::InitApply(o)) => {
                            let key = ObjectKey::of(&o);
                            match self.book.charge(&key, o.weight()) {
                                Admit::Store => self.writer.apply_watcher_event(&watcher::Event::InitApply(o)),
                                Admit::Drop => {
                                    dropped.extend(key.namespace);
                                }
                            }
                        }
                        Ok(watcher::Event::InitDone) => {
                            // Charged before, not listed again: gone meanwhile.
                            self.book.listed();
                            self.writer.apply_watcher_event(&watcher::Event::InitDone);
                            // Namespaces held back while this list ran, after some of their
                            // objects were taken.
                            for ns in self.accounts.held_namespaces() {
                                if self.drop_namespace(&ns) {
                                    dropped.insert(ns);
                                }
                            }
                            self.accounts.relisted(id, &dropped);
                            listed_at = tokio::time::Instant::now();
                            self.relisted(&mut before_relist);
                        }
                        Err(err) => tracing::warn!(
                            kind = what.as_str(),
                            "watch failed, retrying with backoff: {err}"
                        ),
                    }
                }
                ns = held.recv() => match ns {
                    Ok(ns) => {
                        if self.drop_namespace(&ns) {
                            self.accounts.dropped(id, &ns);
                        }
                    }
                    Err(broadcast::error::RecvError::Lagged(_)) => {
                        for ns in self.accounts.held_namespaces() {
                            if self.drop_namespace(&ns) {
                                self.accounts.dropped(id, &ns);
                            }
                        }
                    }
                    Err(broadcast::error::RecvError::Closed) => return,
                },
                changed = readmitted.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    if relist_at.is_none() && self.accounts.wants_relist(id) {
                        relist_at = Some((listed_at + self.accounts.relist_floor()).max(tokio::time::Instant::now()));
                    }
                }
                () = relist => {
                    relist_at = None;
                    if self.accounts.wants_relist(id) {
                        tracing::info!(kind = what.as_str(), "listing again to take back objects of namespaces under the cache caps again");
                        stream = self.events();
                    }
                }
            }
        }
    }

    fn index(&self) -> std::sync::MutexGuard<'_, OwnerIndex> {
        self.index.locked()
    }

    fn send(&self, object: &Cached) {
        let owners = object.metadata.owner_references.clone().unwrap_or_default();
        let _ = self.changes.send(Arc::new(Change {
            key: ObjectKey::of(object),
            owners,
        }));
    }

    /// A new version of an object: stored if its namespace is not held back.
    fn apply(&mut self, object: Cached) {
        let key = ObjectKey::of(&object);
        match self.book.charge(&key, object.weight()) {
            Admit::Store => {
                self.index().set(key, owner_uids(&object));
                let event = watcher::Event::Apply(object);
                self.writer.apply_watcher_event(&event);
                if let watcher::Event::Apply(object) = &event {
                    self.send(object);
                }
            }
            Admit::Drop => {
                // Any older version goes too; no controller is told (none is handed it).
                self.index().remove(&key);
                self.writer
                    .apply_watcher_event(&watcher::Event::Delete(Cached::stub(&key)));
            }
        }
    }

    /// Drops every stored object of a namespace held back; says whether there was any.
    fn drop_namespace(&mut self, namespace: &str) -> bool {
        let keys: Vec<ObjectKey> = self
            .store
            .state()
            .iter()
            .filter(|o| o.metadata.namespace.as_deref() == Some(namespace))
            .map(|o| ObjectKey::of(o))
            .collect();
        for key in &keys {
            self.index().remove(key);
            self.writer
                .apply_watcher_event(&watcher::Event::Delete(Cached::stub(key)));
        }
        !keys.is_empty()
    }

    /// After a (re)list: the owner index rebuilt, and every object announced, those that
    /// vanished meanwhile included.
    fn relisted(&self, before_relist: &mut HashSet<ObjectKey>) {
        let now = self.store.state();
        {
            let mut owned = self.index();
            *owned = OwnerIndex::default();
            for object in &now {
                owned.set(ObjectKey::of(object), owner_uids(object));
            }
        }
        tracing::debug!(
            kind = self.what.as_str(),
            objects = now.len(),
            "watch (re)listed"
        );
        for object in &now {
            before_relist.remove(&ObjectKey::of(object));
            self.send(object);
        }
        for key in before_relist.drain() {
            let _ = self.changes.send(Arc::new(Change {
                key,
                owners: Vec::new(),
            }));
        }
    }
}
