//! A target's rate limits, in one place: the limits a connection declares ([`limits`]),
//! what the target's headers state ([`headers`], with a connection's own
//! [`signals`]), a budget's shared state and how slots
//! are leased from it ([`budget`]), the learned rate ([`controller`]), 429 blocks
//! ([`blocks`]) and the in-process pacer that hands slots to calls ([`pacer`]).
//!
//! The chain asks it for request slots and hands it one signal per answer
//! ([`answer::Answer`]: sent, refused with a wait, or not sent, with the headers stating a
//! quota, what remains, the reset); the [`answer::Verdict`] says what the chain does next.

pub mod answer;
pub mod blocks;
pub mod budget;
pub mod controller;
pub mod headers;
pub mod limits;
pub mod pacer;
pub mod report;
pub mod signals;
#[cfg(test)]
mod sim;
pub mod tuning;

#[cfg(test)]
mod tests {
    use super::{budget, controller, pacer};

    /// The value docs/pacing.md gives `name` in its table of what can be tuned, in seconds,
    /// shares or counts ("3 s", "100 ms", "2%", "2%/s", "1/min", "0.92").
    fn documented(doc: &str, name: &str) -> f64 {
        let row = doc
            .lines()
            .find(|l| l.starts_with(&format!("| `{name}` |")))
            .unwrap_or_else(|| panic!("docs/pacing.md has no row for {name}"));
        let cell = row.split('|').nth(2).unwrap().trim();
        let number = |s: &str| {
            s.trim()
                .parse::<f64>()
                .unwrap_or_else(|_| panic!("{name}: {cell}"))
        };
        if let Some(v) = cell.strip_suffix("%/s").or(cell.strip_suffix('%')) {
            number(v) / 100.0
        } else if let Some(v) = cell.strip_suffix("ms") {
            number(v) / 1000.0
        } else if let Some(v) = cell.strip_suffix("/min") {
            number(v) / 60.0
        } else if let Some(v) = cell.strip_suffix(" s") {
            number(v)
        } else {
            number(cell)
        }
    }

    #[test]
    fn the_documented_tunables_are_the_ones_in_the_code() {
        let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/pacing.md"))
            .unwrap();
        let p = controller::PARAMS;
        let code = [
            ("decrease", p.decrease),
            ("deep_decrease", p.deep_decrease),
            ("min_sample", p.min_sample as f64),
            ("approach", p.approach),
            ("probe", p.probe),
            ("hold", p.hold),
            ("floor", p.floor),
            ("HEADROOM", budget::HEADROOM),
            ("BUCKETS", budget::BUCKETS as f64),
            ("RECENT_TRIPS", pacer::RECENT_TRIPS as f64),
            ("SLICE", budget::SLICE.as_secs_f64()),
            ("SPENT_WAIT", pacer::SPENT_WAIT.as_secs_f64()),
        ];
        for (name, value) in code {
            let doc = documented(&doc, name);
            assert!(
                (doc - value).abs() < 1e-9,
                "{name}: docs say {doc}, the code {value}"
            );
        }
        let rows = doc.lines().filter(|l| l.starts_with("| `")).count();
        assert_eq!(
            rows,
            code.len(),
            "a row of docs/pacing.md names no value of the code"
        );
    }
}
