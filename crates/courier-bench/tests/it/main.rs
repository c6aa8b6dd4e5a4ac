//! The bench's tests, one binary: the small forms of its scenarios and of the chaos suite.
//! Run one module with `cargo test -p courier-bench --test it chaos::`.

#[path = "../../../../tests/it/common/mod.rs"]
mod common;

mod bench_smoke;
mod chaos;
