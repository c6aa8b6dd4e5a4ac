//! The writer's contract: what one call carries ([`Call`]) and what every writer does
//! ([`Writer`]).

use futures::{FutureExt, future::BoxFuture};

use super::wire::{Outgoing, Receipt, WriteError, Written};
use super::{answer, request, secrets};
use crate::ratelimit::signals::RateSignals;

/// What one call carries: records of one rule, made a call by [`Writer::group`].
#[derive(Clone, Copy, Debug)]
pub struct Call<'a> {
    /// The records, at least one.
    pub records: &'a [Outgoing<'a>],
    /// Whether the rule sends several records per call (its `records_per_call` is above
    /// 1): its calls take the bulk form even when one carries a single record.
    pub bulk: bool,
    /// How the rule's answers name each record's fate (`http_json`); `None`: the generic
    /// per-item array.
    pub answer: Option<&'a answer::AnswerMap>,
    /// How the rule's requests are shaped (`http_json`); `None`: each payload by POST.
    pub request: Option<&'a request::RequestShape>,
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
    /// Delivers one record. Each call is exactly one request to the target.
    fn write<'a>(&'a self, out: Outgoing<'a>) -> BoxFuture<'a, Result<Receipt, WriteError>>;

    /// Puts the records of a batch (their payloads, in the batch's order) into calls of at
    /// most `per_call` records each, as indexes into `payloads`; every record is in exactly
    /// one call. By default, in order, `per_call` at a time.
    fn group(
        &self,
        path: &str,
        payloads: &[&serde_json::Value],
        per_call: usize,
    ) -> Vec<Vec<usize>> {
        let _ = path;
        (0..payloads.len())
            .collect::<Vec<_>>()
            .chunks(per_call.max(1))
            .map(<[usize]>::to_vec)
            .collect()
    }

    /// Sends one request of a job (its open and close, a poll, a page of its errors) to
    /// `path` (under the connection's base URL, or an absolute URL at the same origin) with
    /// the connection's credentials, `body` as JSON; the receipt holds the answer's body.
    fn ask<'a>(
        &'a self,
        method: reqwest::Method,
        path: &'a str,
        body: Option<&'a serde_json::Value>,
    ) -> BoxFuture<'a, Result<Receipt, WriteError>> {
        let _ = (method, path, body);
        futures::future::ready(Err(WriteError::Permanent {
            status: None,
            message: "this writer reads no job".into(),
        }))
        .boxed()
    }

    /// Reads a file the target named at `url` (a job's errors file, at an origin its rule
    /// allows) with a GET carrying none of the connection's credentials or headers; the
    /// receipt holds its text.
    fn fetch<'a>(&'a self, url: &'a reqwest::Url) -> BoxFuture<'a, Result<Receipt, WriteError>> {
        let _ = url;
        futures::future::ready(Err(WriteError::Permanent {
            status: None,
            message: "this writer reads no file".into(),
        }))
        .boxed()
    }

    /// Delivers the records of one call made by [`Writer::group`]: exactly one request to
    /// the target. An error is the answer of the whole call; [`WriteError::Permanent`] for
    /// several records means some of them are bad, which the caller finds by splitting.
    /// By default a call carries one record, written by [`Writer::write`].
    fn write_many<'a>(&'a self, call: Call<'a>) -> BoxFuture<'a, Result<Written, WriteError>> {
        match call.records {
            [one] => self
                .write(*one)
                .map(|r| r.map(|receipt| Written::all(receipt, 1)))
                .boxed(),
            _ => futures::future::ready(Err(WriteError::Permanent {
                status: None,
                message: format!(
                    "this writer sends one record per call, not {}",
                    call.records.len()
                ),
            }))
            .boxed(),
        }
    }
}
