//! The Engine's settings: the pooling allocator (its slots, how a freed slot is reset), and
//! the epoch ticker that deadlines count in.

use std::time::Duration;

use wasmtime::{
    Config, Enabled, Engine, InstanceAllocationStrategy, PoolingAllocationConfig, ProfilingStrategy,
};

use super::compiler::codegen_config;
use super::engine::SandboxConfig;

/// Table memory kept resident per freed pool slot.
const KEEP_RESIDENT_TABLE_BYTES: usize = 64 << 10;

/// How a freed slot's touched pages are found. PAGEMAP_SCAN (Linux 6.7+) reports the pages
/// written since the last reset, and wasmtime resets only those; a written page that was
/// swapped out is not reported, so on a machine with swap a reused slot could keep a page of
/// another call (wasmtime's open issue). With swap, the reset does without it: the kept
/// resident bytes are zeroed whole (memset) and the rest discarded (madvise), which cannot
/// skip a page, whatever is swapped.
fn pagemap_scan(swap: bool) -> Enabled {
    match swap {
        true => Enabled::No,
        false => Enabled::Auto,
    }
}

/// How this sandbox resets a freed slot's memory: decided once at start, logged when it is
/// not the page scan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PageReset {
    /// `PAGEMAP_SCAN` finds the pages a call wrote, and only those are reset.
    TouchedPages,
    /// The machine has swap: the kept resident bytes are zeroed whole, the rest discarded.
    WholeWithSwap,
    /// The kernel has no `PAGEMAP_SCAN` (Linux before 6.7, or `/proc` unreadable): the same.
    WholeWithoutPageScan,
}

impl PageReset {
    /// What this machine allows: wasmtime's own probe of the ioctl, unless there is swap.
    pub(crate) fn on_this_machine(swap: bool) -> PageReset {
        match (swap, PoolingAllocationConfig::is_pagemap_scan_available()) {
            (true, _) => PageReset::WholeWithSwap,
            (false, true) => PageReset::TouchedPages,
            (false, false) => PageReset::WholeWithoutPageScan,
        }
    }

    /// Says at start what the reset is when it is not the page scan (slower resets).
    pub(crate) fn log(self) {
        match self {
            PageReset::TouchedPages => {}
            PageReset::WholeWithSwap => tracing::info!(
                "this machine has swap: freed guest memory is reset without PAGEMAP_SCAN, which could skip a swapped-out page (slower resets, never a page of another call)"
            ),
            PageReset::WholeWithoutPageScan => tracing::info!(
                "this kernel has no PAGEMAP_SCAN (Linux 6.7 or later has it): freed guest memory is reset whole, not only the pages a call wrote (slower resets)"
            ),
        }
    }
}

/// Whether `/proc/meminfo` says the machine has swap (`SwapTotal` above 0). Unreadable: yes
/// (the safe reset only costs time).
pub fn machine_has_swap() -> bool {
    std::fs::read_to_string("/proc/meminfo").map_or(true, |m| swap_in_meminfo(&m))
}

fn swap_in_meminfo(meminfo: &str) -> bool {
    meminfo
        .lines()
        .find_map(|l| l.strip_prefix("SwapTotal:"))
        .is_none_or(|v| {
            v.split_whitespace()
                .next()
                .and_then(|kib| kib.parse::<u64>().ok())
                .is_none_or(|kib| kib > 0)
        })
}

pub(crate) fn engine_config(config: &SandboxConfig, swap: bool) -> Config {
    let mut pool = PoolingAllocationConfig::new();
    let n = config.max_instances;
    pool.total_component_instances(n)
        .total_core_instances(n * 16)
        .max_core_instances_per_component(16)
        .total_memories(n * 2)
        .max_memories_per_component(2)
        // A freed slot stays affine to the module that used it (its pages, its mappings), and
        // another module takes a slot never used before any slot affine to a module: with the
        // bound at the pool's size, a slot is taken from another module only when every slot
        // has been used (wasmtime's default, 100, is below the pool's size from
        // `--max-instances 51` up).
        .max_unused_warm_slots(n * 2)
        .total_tables(n * 8)
        .max_tables_per_component(8)
        .max_memory_size(config.max_memory_bytes)
        .total_stacks(n)
        // A freed slot is reset in place up to these sizes and stays resident, instead of
        // being handed back with madvise and faulted in again by the next call; with
        // PAGEMAP_SCAN (Linux 6.7+, used when the kernel has it) only the pages the call
        // touched are reset. At most `n` slots × these bytes stay resident.
        .linear_memory_keep_resident(config.resident_memory_bytes)
        .table_keep_resident(KEEP_RESIDENT_TABLE_BYTES)
        .pagemap_scan(pagemap_scan(swap));
    let mut cfg = codegen_config(config.epoch_interruption);
    cfg.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
    if config.copy_memory {
        cfg.memory_init_cow(false);
    }
    if config.perf_map {
        cfg.profiler(ProfilingStrategy::PerfMap);
    }
    cfg
}

/// Advances the epoch every `tick` for as long as the Engine lives. The thread holds only a
/// weak reference, so it ends when the last Engine clone is dropped. Started once, when the
/// sandbox is made; without it no guest could be stopped, so a failure to spawn it ends the
/// process before any guest runs.
#[allow(clippy::expect_used)]
pub(crate) fn start_epoch_ticker(engine: &Engine, tick: Duration) {
    let weak = engine.weak();
    std::thread::Builder::new()
        .name("kubewasm-epoch".into())
        .spawn(move || {
            while let Some(engine) = weak.upgrade() {
                engine.increment_epoch();
                drop(engine);
                std::thread::sleep(tick);
            }
        })
        .expect("spawning the epoch ticker thread");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn swap_turns_the_page_scanning_reset_off() {
        let with =
            "MemTotal:       24000000 kB\nSwapTotal:       8388604 kB\nSwapFree: 8388604 kB\n";
        let without = "MemTotal:       24000000 kB\nSwapTotal:             0 kB\n";
        assert!(swap_in_meminfo(with));
        assert!(!swap_in_meminfo(without));
        // What cannot be read is taken for swap: the safe reset.
        assert!(swap_in_meminfo("MemTotal: 1 kB\n"));
        assert!(swap_in_meminfo("SwapTotal: lots\n"));
        assert!(matches!(pagemap_scan(true), Enabled::No));
        assert!(matches!(pagemap_scan(false), Enabled::Auto));
        // What the sandbox says it does: never the page scan with swap; without, what the
        // kernel offers (wasmtime's probe, the one its pool uses for `Enabled::Auto`).
        assert_eq!(PageReset::on_this_machine(true), PageReset::WholeWithSwap);
        let available = PoolingAllocationConfig::is_pagemap_scan_available();
        assert_eq!(
            PageReset::on_this_machine(false) == PageReset::TouchedPages,
            available
        );
    }

    /// Instances of a module with data (42 at byte 64) in reused slots of an engine made with
    /// `config`: each must find the data as the module has it and every other byte zero,
    /// whatever the instance before wrote.
    fn reused_slots_start_clean(config: &SandboxConfig, swap: bool) {
        let engine = Engine::new(&engine_config(config, swap)).unwrap();
        let module = wasmtime::Module::new(
            &engine,
            r#"(module (memory (export "m") 2)
                 (data (i32.const 64) "\2a")
                 (func (export "f") (result i32)
                   (local $seen i32)
                   (local.set $seen (i32.add
                     (i32.mul (i32.load8_u (i32.const 64)) (i32.const 1000))
                     (i32.load8_u (i32.const 70000))))
                   (i32.store8 (i32.const 64) (i32.const 7))
                   (i32.store8 (i32.const 70000) (i32.const 9))
                   (local.get $seen)))"#,
        )
        .unwrap();
        for _ in 0..3 {
            let mut store = wasmtime::Store::new(&engine, ());
            store.set_epoch_deadline(u64::MAX / 2);
            let instance = wasmtime::Instance::new(&mut store, &module, &[]).unwrap();
            let f = instance.get_typed_func::<(), i32>(&mut store, "f").unwrap();
            assert_eq!(
                f.call(&mut store, ()).unwrap(),
                42_000,
                "a reused slot kept a page of the instance before"
            );
        }
    }

    #[test]
    fn reused_slots_start_clean_with_or_without_swap_copied_or_mapped() {
        for swap in [false, true] {
            reused_slots_start_clean(&SandboxConfig::default(), swap);
            let copied = SandboxConfig {
                copy_memory: true,
                resident_memory_bytes: 16 << 20,
                ..SandboxConfig::default()
            };
            reused_slots_start_clean(&copied, swap);
        }
    }
}
