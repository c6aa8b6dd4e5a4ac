//! The engine's tests, one binary: each module one subject, against the real PostgreSQL and
//! real HTTP servers on loopback; `common` holds their helpers. Run one module with
//! `cargo test --test it pacing::`, one test by (part of) its name.

mod common;

mod bulk;
mod delete;
mod engine;
mod erasure;
mod fresh_table;
mod hostile;
mod jobs;
mod limits;
mod ops;
mod pacing;
mod poison;
mod presets;
mod queue;
mod rate_headers;
mod rescue;
mod retention;
mod schema;
mod secrets;
mod skew;
mod throttle;
mod usercom;
mod validation;
mod vendor_specs;
