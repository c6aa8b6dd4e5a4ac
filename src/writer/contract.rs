//! The writer's contract: what one call carries ([`Call`]), what every writer does
//! ([`Writer`]) and what a writer that runs a target's jobs does besides ([`JobCalls`]).

use futures::future::BoxFuture;

use super::wire::{Outgoing, Receipt, WriteError, Written};
use super::{answer, request, secrets};
use crate::ratelimit::signals::RateSignals;

/// What one call carries: records of one rule, made a call by its profile
/// ([`crate::profile::RuleProfile::calls`]).
#[derive(Clone, Copy, Debug)]
pub struct Call<'a> {
    /// The records, at least one.
    pub records: &'a [Outgoing<'a>],
    /// Whether the call takes the bulk form: the rule sends several records per call (its
    /// `records_per_call` is above 1), even when this one carries a single record; or, for
    /// a rule that groups its records, this is a group's call.
    pub bulk: bool,
    /// How the rule's answers name each record's fate (`http_json`); `None`: the generic
    /// per-item array.
    pub answer: Option<&'a answer::AnswerMap>,
    /// How the rule's requests are shaped (`http_json`); `None`: each payload by POST.
    pub request: Option<&'a request::RequestShape>,
    /// A delete of its one record, as the request shape's `delete` says (never bulk).
    pub delete: bool,
}

/// Delivers records to one target connection.
pub trait Writer: Send + Sync {
    /// The connection's secrets: every answer passes [`Secrets::seal`] before the call
    /// stage keeps any of it.
    fn secrets(&self) -> &secrets::Secrets;
    /// How many calls may be in flight at once.
    fn max_in_flight(&self) -> usize;
    /// What the target says about its rate beyond the standard headers (the connection's
    /// `rate_signals`), read by the pacer from every answer.
    fn rate_signals(&self) -> &RateSignals;
    /// Delivers the records of one call (as the rule's profile groups them): exactly one request to
    /// the target. An error is the answer of the whole call; [`WriteError::Permanent`] for
    /// several records means some of them are bad, which the caller finds by splitting.
    fn write_many<'a>(&'a self, call: Call<'a>) -> BoxFuture<'a, Result<Written, WriteError>>;

    /// What the writer does for a target's asynchronous jobs, if it runs any.
    fn jobs(&self) -> Option<&dyn JobCalls> {
        None
    }
}

/// What only a writer that runs a target's asynchronous jobs does: the job's own requests,
/// and the files its answers name.
pub trait JobCalls: Send + Sync {
    /// Sends one request of a job (its open and close, a poll, a page of its errors) to
    /// `path` (under the connection's base URL, or an absolute URL at the same origin) with
    /// the connection's credentials, `body` as JSON (of `content_type`, else
    /// `application/json`); the receipt holds the answer's body.
    fn ask<'a>(
        &'a self,
        method: reqwest::Method,
        path: &'a str,
        body: Option<&'a serde_json::Value>,
        content_type: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Receipt, WriteError>>;

    /// Reads a file the target named at `url` (a job's errors file, at an origin its rule
    /// allows) with a GET carrying none of the connection's credentials or headers; the
    /// receipt holds its text.
    fn fetch<'a>(&'a self, url: &'a reqwest::Url) -> BoxFuture<'a, Result<Receipt, WriteError>>;
}

/// The error of a job's request to a writer that runs no job.
pub fn no_jobs() -> WriteError {
    WriteError::Permanent {
        status: None,
        message: "this connection's writer runs no asynchronous job".into(),
    }
}
