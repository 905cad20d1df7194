//! The `kubewasm` command's library face: the runtime ([`kubewasm_runtime`]) and the floors
//! below it under one name, for the tests and benches that drive them (`kubewasm::manager`,
//! `kubewasm::api`, …). The command itself is `main.rs` and `cli/`, one file per subcommand.

pub use kubewasm_runtime::*;
