//! Bounded capture of guest stdout/stderr: keeps the first bytes, counts the rest.
//!
//! A guest that floods its output is not failed for it (a full pipe would make Rust's
//! `println!` panic); it just loses what did not fit, and the log says how much.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamError};

/// What a guest wrote to one stream during one call.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Captured {
    /// The first bytes written, up to the limit.
    pub kept: Vec<u8>,
    /// How many bytes were written past the limit and dropped.
    pub dropped: u64,
}

impl Captured {
    /// The kept bytes as text (lossy).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.kept).into_owned()
    }
}

#[derive(Debug)]
struct Inner {
    captured: Captured,
    limit: usize,
}

/// A WASI output stream that never fails and never grows past its limit.
#[derive(Debug, Clone)]
pub(crate) struct BoundedOutput(Arc<Mutex<Inner>>);

impl BoundedOutput {
    pub(crate) fn new(limit: usize) -> Self {
        BoundedOutput(Arc::new(Mutex::new(Inner {
            captured: Captured::default(),
            limit,
        })))
    }

    pub(crate) fn take(&self) -> Captured {
        std::mem::take(&mut self.lock().captured)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A poisoned lock only means another writer panicked; the bytes are still valid.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn push(&self, bytes: &[u8]) {
        let mut inner = self.lock();
        let room = inner.limit.saturating_sub(inner.captured.kept.len());
        let keep = room.min(bytes.len());
        inner.captured.kept.extend_from_slice(&bytes[..keep]);
        inner.captured.dropped += (bytes.len() - keep) as u64;
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for BoundedOutput {
    async fn ready(&mut self) {}
}

#[wasmtime_wasi::async_trait]
impl OutputStream for BoundedOutput {
    fn write(&mut self, bytes: bytes::Bytes) -> Result<(), StreamError> {
        self.push(&bytes);
        Ok(())
    }

    fn flush(&mut self) -> Result<(), StreamError> {
        Ok(())
    }

    fn check_write(&mut self) -> Result<usize, StreamError> {
        Ok(64 << 10)
    }
}

impl tokio::io::AsyncWrite for BoundedOutput {
    fn poll_write(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.push(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

impl IsTerminal for BoundedOutput {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for BoundedOutput {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }

    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_first_bytes_and_counts_the_rest() {
        let out = BoundedOutput::new(4);
        out.push(b"abc");
        out.push(b"defg");
        let got = out.take();
        assert_eq!(got.kept, b"abcd");
        assert_eq!(got.dropped, 3);
        assert_eq!(out.take(), Captured::default());
    }
}
