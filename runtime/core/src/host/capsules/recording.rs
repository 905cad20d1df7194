//! Reads recorded on their way to the guest ([`Recording`]), and answered again from the
//! record offline ([`Replayed`]).

use std::sync::Mutex;

use serde_json::Value;

use super::{ReadError, ReadOp, RecordedRead};
use crate::sandbox::{Error, Reads, SharedReads};
use crate::sync::Locks as _;

/// Objects a recording keeps in all (a reconcile's reads are bounded by `limits.hostCalls` and
/// the guest's memory; the capsule by bytes): past it the record says it is incomplete.
const MAX_RECORDED_OBJECTS: usize = 1_000;

/// The reads of one call, passed through to `inner` and recorded with their answers.
pub struct Recording {
    inner: SharedReads,
    record: Mutex<Record>,
}

#[derive(Default)]
struct Record {
    reads: Vec<RecordedRead>,
    objects: usize,
    overflowed: bool,
}

impl Recording {
    /// Records the reads answered by `inner`.
    pub fn new(inner: SharedReads) -> Recording {
        Recording {
            inner,
            record: Mutex::default(),
        }
    }

    /// A copy of the reads so far (a candidate module is answered them: [`Replayed::or`]).
    pub fn reads(&self) -> Vec<RecordedRead> {
        self.record.locked().reads.clone()
    }

    /// The reads so far, and whether every one is in them.
    pub fn take(&self) -> (Vec<RecordedRead>, bool) {
        let mut record = self.record.locked();
        (std::mem::take(&mut record.reads), !record.overflowed)
    }

    fn keep(&self, read: RecordedRead) {
        let mut record = self.record.locked();
        if record.overflowed || record.objects + read.objects.len() > MAX_RECORDED_OBJECTS {
            record.overflowed = true;
            return;
        }
        record.objects += read.objects.len();
        record.reads.push(read);
    }
}

fn read_error(e: &Error) -> ReadError {
    ReadError {
        message: e.message.clone(),
        retryable: e.retryable,
    }
}

impl Reads for Recording {
    fn get(
        &self,
        api_version: &str,
        kind: &str,
        namespace: Option<&str>,
        name: &str,
    ) -> Result<Option<Value>, Error> {
        let answer = self.inner.get(api_version, kind, namespace, name);
        self.keep(RecordedRead {
            op: ReadOp::Get,
            api_version: api_version.to_owned(),
            kind: kind.to_owned(),
            namespace: namespace.map(str::to_owned),
            name: Some(name.to_owned()),
            label_selector: None,
            objects: answer
                .as_ref()
                .ok()
                .and_then(Clone::clone)
                .into_iter()
                .collect(),
            error: answer.as_ref().err().map(read_error),
        });
        answer
    }

    fn list(
        &self,
        api_version: &str,
        kind: &str,
        namespace: Option<&str>,
        label_selector: Option<&str>,
    ) -> Result<Vec<Value>, Error> {
        let answer = self
            .inner
            .list(api_version, kind, namespace, label_selector);
        self.keep(RecordedRead {
            op: ReadOp::List,
            api_version: api_version.to_owned(),
            kind: kind.to_owned(),
            namespace: namespace.map(str::to_owned),
            name: None,
            label_selector: label_selector.map(str::to_owned),
            objects: answer.as_ref().ok().cloned().unwrap_or_default(),
            error: answer.as_ref().err().map(read_error),
        });
        answer
    }
}

/// A capsule's reads, answered again: each read of the replay gets the answer of the first
/// recorded read with the same arguments not answered yet; a read the record does not have is
/// refused (permanently), saying so — the module reads differently than the one recorded.
pub struct Replayed {
    reads: Mutex<Vec<(RecordedRead, bool)>>,
    /// Where a read the record does not have is answered, if anywhere.
    otherwise: Option<SharedReads>,
}

impl Replayed {
    /// Answers from `reads`.
    pub fn new(reads: Vec<RecordedRead>) -> Replayed {
        Replayed {
            reads: Mutex::new(reads.into_iter().map(|r| (r, false)).collect()),
            otherwise: None,
        }
    }

    /// Answers from `reads`, and a read they do not have from `otherwise`: a candidate module
    /// run after the live one sees what the live one saw (not the live one's own writes), and
    /// the caches for what only it reads.
    pub fn or(reads: Vec<RecordedRead>, otherwise: SharedReads) -> Replayed {
        Replayed {
            otherwise: Some(otherwise),
            ..Replayed::new(reads)
        }
    }

    /// The recorded reads the replay did not make.
    pub fn unused(&self) -> usize {
        self.reads.locked().iter().filter(|(_, used)| !used).count()
    }

    fn answer(
        &self,
        op: ReadOp,
        api_version: &str,
        kind: &str,
        namespace: Option<&str>,
        name_or_selector: Option<&str>,
    ) -> Result<Vec<Value>, Error> {
        let mut reads = self.reads.locked();
        let found = reads.iter_mut().find(|(r, used)| {
            !used
                && r.op == op
                && r.api_version == api_version
                && r.kind == kind
                && r.namespace.as_deref() == namespace
                && match op {
                    ReadOp::Get => r.name.as_deref() == name_or_selector,
                    ReadOp::List => r.label_selector.as_deref() == name_or_selector,
                }
        });
        let Some((read, used)) = found else {
            drop(reads);
            if let Some(otherwise) = &self.otherwise {
                return match op {
                    ReadOp::Get => otherwise
                        .get(
                            api_version,
                            kind,
                            namespace,
                            name_or_selector.unwrap_or_default(),
                        )
                        .map(|o| o.into_iter().collect()),
                    ReadOp::List => otherwise.list(api_version, kind, namespace, name_or_selector),
                };
            }
            let what = match op {
                ReadOp::Get => "get",
                ReadOp::List => "list",
            };
            return Err(Error::permanent(format!(
                "replay: the capsule has no answer for {what} {api_version} {kind} (namespace {namespace:?}, {:?}): this module reads differently than the one recorded",
                name_or_selector.unwrap_or_default()
            )));
        };
        *used = true;
        match &read.error {
            Some(e) if e.retryable => Err(Error::retryable(e.message.clone())),
            Some(e) => Err(Error::permanent(e.message.clone())),
            None => Ok(read.objects.clone()),
        }
    }
}

impl Reads for Replayed {
    fn get(
        &self,
        api_version: &str,
        kind: &str,
        namespace: Option<&str>,
        name: &str,
    ) -> Result<Option<Value>, Error> {
        self.answer(ReadOp::Get, api_version, kind, namespace, Some(name))
            .map(|objects| objects.into_iter().next())
    }

    fn list(
        &self,
        api_version: &str,
        kind: &str,
        namespace: Option<&str>,
        label_selector: Option<&str>,
    ) -> Result<Vec<Value>, Error> {
        self.answer(ReadOp::List, api_version, kind, namespace, label_selector)
    }
}
