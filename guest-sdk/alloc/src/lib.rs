//! The allocator of kubewasm guests built without WASI (`wasm32-unknown-unknown`).
//!
//! The runtime runs every reconcile in a fresh instance, dropped after the call, and resets the
//! instance's memory for the next one; growing that memory costs a limiter check at the call
//! and a re-protection of the grown pages at the next instantiation. On `wasm32-wasip2` wasi-libc's
//! `malloc` first uses what is left of the initial memory after the stack and the static data,
//! so a reconcile of a small object never grows memory. Rust's own allocator on
//! `wasm32-unknown-unknown` (dlmalloc over `memory.grow`) never uses that tail: it grows memory
//! at the first allocation of every call, which made the WASI-free build slower than the wasip2
//! one (BENCHMARKS.md, P1). [`TailFirst`] serves allocations from that tail first, by bumping a
//! pointer (the instance lives for one call), and hands the rest to the standard allocator.
//!
//! On every other target this crate is empty: the SDK depends on it only for
//! `wasm32-unknown-unknown`, where it installs [`TailFirst`] as the global allocator.

#[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
#[allow(unsafe_code)]
mod tail;

#[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
pub use tail::TailFirst;
