//! [`TailFirst`]: a bump allocator over the initial memory's free tail, dlmalloc after it.
//!
//! Each allocation in the tail is a pointer bump; freeing the newest one (and growing or
//! shrinking it with `realloc`) moves the pointer back, which is what a growing `Vec` or
//! `String` does; any other freed block of the tail stays used until the instance is dropped,
//! so at most the tail's size (the initial memory less the stack and the data: some 800 KiB
//! with the workspace's `--initial-memory` of 1 MiB) is held that way. What does not fit goes
//! to the standard allocator, which frees as usual. The guest is single-threaded (no `atomics`
//! target feature), so the relaxed atomics below compile to plain loads and stores.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

/// Bytes in a WebAssembly page.
const PAGE: usize = 65_536;

unsafe extern "C" {
    /// Defined by `wasm-ld`: the first byte after the stack and the static data.
    static __heap_base: u8;
}

/// The next free byte of the tail; 0 until the first allocation.
static NEXT: AtomicUsize = AtomicUsize::new(0);
/// The end of the tail: the instance's initial memory size, taken at the first allocation.
static END: AtomicUsize = AtomicUsize::new(0);

/// The global allocator of WASI-free guests: the initial memory's tail first, then
/// [`System`] (Rust's dlmalloc over `memory.grow`).
pub struct TailFirst;

#[global_allocator]
static ALLOCATOR: TailFirst = TailFirst;

/// Where the tail starts.
fn base() -> usize {
    (&raw const __heap_base) as usize
}

/// The tail's next free byte and its end, set at the first call (before anything could have
/// grown memory: this is the only allocator until the tail is used up).
fn tail() -> (usize, usize) {
    let next = NEXT.load(Relaxed);
    if next != 0 {
        return (next, END.load(Relaxed));
    }
    let (start, end) = (
        base(),
        core::arch::wasm32::memory_size(0).saturating_mul(PAGE),
    );
    NEXT.store(start, Relaxed);
    END.store(end, Relaxed);
    (start, end)
}

/// Whether `ptr` was handed out from the tail.
fn in_tail(ptr: *mut u8) -> bool {
    let at = ptr as usize;
    at >= base() && at < END.load(Relaxed)
}

/// `size` bytes at `align` from the tail, if they fit.
fn bump(size: usize, align: usize) -> Option<*mut u8> {
    let (next, end) = tail();
    let start = next.checked_next_multiple_of(align)?;
    let stop = start.checked_add(size).filter(|&stop| stop <= end)?;
    NEXT.store(stop, Relaxed);
    Some(start as *mut u8)
}

// SAFETY: blocks handed out from the tail never overlap: `NEXT` only moves forward past a block
// handed out, and back only over the newest block when it is freed or resized. The tail is
// memory below the initial memory's end that nothing else uses (wasm-ld puts the stack and the
// static data below `__heap_base`; dlmalloc only uses memory it grows), and blocks from
// `System` stay `System`'s: `in_tail` tells them apart by address.
unsafe impl GlobalAlloc for TailFirst {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        match bump(layout.size(), layout.align()) {
            Some(ptr) => ptr,
            // SAFETY: the caller's contract for `layout` is `System`'s.
            None => unsafe { System.alloc(layout) },
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if in_tail(ptr) {
            if (ptr as usize).wrapping_add(layout.size()) == NEXT.load(Relaxed) {
                NEXT.store(ptr as usize, Relaxed);
            }
        } else {
            // SAFETY: a block not in the tail came from `System` with this layout.
            unsafe { System.dealloc(ptr, layout) }
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if !in_tail(ptr) {
            // SAFETY: a block not in the tail came from `System` with this layout.
            return unsafe { System.realloc(ptr, layout, new_size) };
        }
        let at = ptr as usize;
        let newest = at.wrapping_add(layout.size()) == NEXT.load(Relaxed);
        if newest
            && at
                .checked_add(new_size)
                .is_some_and(|stop| stop <= END.load(Relaxed))
        {
            NEXT.store(at + new_size, Relaxed);
            return ptr;
        }
        if new_size <= layout.size() {
            return ptr;
        }
        // SAFETY: `new_size` with the old alignment is a valid layout (the caller's contract).
        let grown =
            unsafe { self.alloc(Layout::from_size_align_unchecked(new_size, layout.align())) };
        if !grown.is_null() {
            // SAFETY: both blocks are valid for the old size (the new one is larger) and do not
            // overlap (the old one is still allocated); then the old block is freed.
            unsafe {
                core::ptr::copy_nonoverlapping(ptr, grown, layout.size());
                self.dealloc(ptr, layout);
            }
        }
        grown
    }
}
