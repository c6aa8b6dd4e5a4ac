//! The tooling of the `courier` command line that is more than a call into the engine:
//! the end-to-end [`demo`], the private PostgreSQL [`cluster`] it and the benchmark
//! harness (`crates/courier-bench`) may start, the live [`progress`] line, the [`tables`]
//! people read, and the worker's metrics and dashboard server ([`web`]). The binary
//! (`src/main.rs`) parses arguments and hands over to the engine library (`courier`), the
//! local target (`courier_target`) or these modules; they are a library so this crate's
//! tests (and the benchmark harness) can use them.

pub mod cluster;
pub mod demo;
pub mod progress;
pub mod tables;
pub mod web;

/// `server_url` with its database replaced by `name`, keeping its parameters
/// (`?sslmode=...`): where the demo and the benchmarks create their own database.
pub fn database_url(server_url: &str, name: &str) -> String {
    let (path, query) = match server_url.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (server_url, None),
    };
    let base = path.rsplit_once('/').map_or(path, |(b, _)| b);
    match query {
        Some(q) => format!("{base}/{name}?{q}"),
        None => format!("{base}/{name}"),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn database_url_swaps_the_database_and_keeps_parameters() {
        assert_eq!(
            super::database_url("postgres://u:p@h:5432/courier?sslmode=require", "x"),
            "postgres://u:p@h:5432/x?sslmode=require"
        );
        assert_eq!(
            super::database_url("postgres://h/postgres", "courier_demo"),
            "postgres://h/courier_demo"
        );
    }
}
