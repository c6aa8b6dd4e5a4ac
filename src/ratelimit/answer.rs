//! The one signal the chain hands the budget per answer, and the verdict it gets back.
//!
//! The chain asks the [pacer](super::pacer) for a slot before a call and, once the call
//! is answered, hands over an [`Answer`]: how the target answered (sent and not refused,
//! refused with a wait, or never sent) and the rate-limit headers it sent. [`Pacer::hear`] reads
//! the headers, teaches the budget, and returns a [`Verdict`] that says what the chain
//! does next: go on, hold until the target's budget resets, or block the budget for a
//! 429's wait. Nothing about 429s or rate-limit headers is decided outside this module.

use std::time::Duration;

use chrono::{DateTime, SubsecRound, Utc};
use reqwest::header::HeaderMap;

use super::{
    blocks, headers,
    pacer::{Pacer, SPENT_WAIT},
    signals::RateSignals,
};

/// How the target answered one call, as the budget hears it.
#[derive(Clone, Debug, PartialEq)]
pub enum Answered {
    /// HTTP 429: the target refused the call for its rate.
    Refused {
        /// The wait the answer named (`Retry-After` or the writer's reset header).
        wait: Option<Duration>,
        /// The raw header value that named it.
        raw: Option<String>,
    },
    /// Any other answer, or none (a connection error, a call the writer refused to send):
    /// the budget hears only its headers. The slot it took counts as let through.
    NotRefused,
}

/// One answer: what the target did and the rate-limit headers it sent.
#[derive(Clone, Debug)]
pub struct Answer<'a> {
    /// How it answered.
    pub answered: Answered,
    /// Its rate-limit headers (empty when none).
    pub headers: &'a HeaderMap,
    /// What the target says about its rate beyond the standard headers (and what an
    /// `X-RateLimit-Reset` of it counts).
    pub signals: &'a RateSignals,
    /// When the call left.
    pub sent: DateTime<Utc>,
    /// The pace its slot was booked at (requests per second).
    pub paced: f64,
}

/// What the chain does after an answer.
#[derive(Clone, Debug, PartialEq)]
pub enum Verdict {
    /// Go on calling.
    GoOn,
    /// The target stated that its budget is spent until `until` (nothing remaining): the
    /// budget holds until then, no 429 met. `stop_batch` when the hold is longer than a
    /// batch should sit out ([`SPENT_WAIT`]).
    Spent {
        /// When the target's budget resets.
        until: DateTime<Utc>,
        /// What the headers said, for the block's record.
        said: String,
        /// Whether the batch stops (the run waits like after a 429).
        stop_batch: bool,
    },
    /// A 429: the call's records stay pending, untouched; the batch stops and the whole
    /// budget is blocked until `until`: from the answer, for the wait it named (see
    /// [`blocks::block_length`]). This process holds back from now on; the job's commit
    /// writes the block for the others.
    Block {
        /// When the block ends (to the microsecond, as the database keeps it).
        until: DateTime<Utc>,
        /// The raw header value that named the wait.
        raw: Option<String>,
    },
}

impl Pacer {
    /// Hears one answer on budget `key`, answered `at`: a quota the headers state becomes
    /// the advertised rate; a call sent and not refused counts for the learned rate; a 429 lowers it
    /// and blocks; a statement that nothing remains holds the budget until the reset.
    pub async fn hear(&self, key: &str, answer: Answer<'_>, at: DateTime<Utc>) -> Verdict {
        let statement = if answer.headers.is_empty() {
            headers::Statement::default()
        } else {
            answer.signals.read(answer.headers, at)
        };
        let stated = statement.limits();
        if !stated.is_empty() {
            self.advertised(key, stated);
        }
        if let Answered::Refused { wait, raw } = answer.answered {
            // A wait the answer named goes before its headers' reset.
            let wait = wait.or(statement.reset);
            let length = chrono::Duration::from_std(blocks::block_length(wait));
            let until = (at + length.expect("capped at a day")).trunc_subsecs(6);
            self.blocks.heard(key, until);
            if let Err(e) = self.throttled(key, answer.sent, answer.paced, until).await {
                tracing::warn!(error = %e, "could not record what the 429 taught the budget");
            }
            return Verdict::Block { until, raw };
        }
        let Some(until) = statement.spent_until(at) else {
            return Verdict::GoOn;
        };
        let wait = (until - at).to_std().unwrap_or_default();
        tracing::debug!(?wait, "the target's budget is spent until its reset");
        self.hold(key, until);
        Verdict::Spent {
            until,
            said: format!("remaining 0; reset {:.3}s", wait.as_secs_f64()),
            stop_batch: wait > SPENT_WAIT,
        }
    }
}
