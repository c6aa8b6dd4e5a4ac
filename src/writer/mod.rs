//! Writers deliver records to one target. A writer says how many calls it may have in
//! flight (the rate is its budget's, [`crate::ratelimit`]); each call answers with a
//! [`Written`] or a typed [`WriteError`] that says whether to retry and whether the target
//! proved reachable. A writer that runs a target's asynchronous jobs does more through
//! [`JobCalls`] (a job's own requests, the files its answers name).
//!
//! A call may carry several records of one rule (the rule's `records_per_call`, up to
//! what [`WriterKind::max_records_per_call`] allows): the rule's profile puts a batch's
//! records into calls (in order, or grouped by a value: [`group`]) and the writer answers
//! each call with one [`Written`], which holds the outcome
//! of every record it carried. A whole call refused with [`WriteError::Permanent`] says
//! that some record of it is bad without saying which: the call stage splits it in halves
//! and sends each again, down to single records (but for a refusal of the request itself,
//! 401, 403, 404, 405 or 407, which is every record's).
//!
//! One writer serves every target: [`http`], the generic HTTP JSON writer, whose targets
//! are data (a connection's auth and a rule's profile: [`request`], [`template`],
//! [`filters`], [`group`], [`delete`], [`answer`], [`job`]; the vendors' own in
//! `presets/`, User.com's among them). What it rests on lives in files of its own, so no file here imports this
//! one: [`wire`] (what a call carries and gets back), [`contract`] (the [`Writer`] and
//! [`JobCalls`] traits), [`auth`] (where credentials may go), [`endpoint`] (the HTTP
//! plumbing).

pub mod answer;
pub mod auth;
pub mod contract;
pub mod delete;
pub mod endpoint;
pub mod erase;
pub mod filters;
pub mod group;
pub mod http;
pub mod job;
pub mod oauth;
pub mod request;
pub mod secrets;
pub mod template;
pub mod wire;

use crate::invalid::Invalid;
use std::sync::Arc;

pub use auth::check_base_url;
pub use contract::{Call, JobCalls, Writer};
pub use wire::*;

use crate::model::Connection;

/// A connection's writer: the generic HTTP JSON writer, whose targets are profiles (auth,
/// request shape, answer map, rate signals: data). The one place a writer's name is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriterKind {
    /// `http_json`: any HTTP JSON API, shaped by the rule's profile.
    HttpJson,
}

impl WriterKind {
    /// Every writer kind.
    pub const ALL: [WriterKind; 1] = [WriterKind::HttpJson];

    /// Its name as stored.
    pub fn name(self) -> &'static str {
        match self {
            WriterKind::HttpJson => "http_json",
        }
    }

    /// The writer kind named `name`; the error names it and the kinds there are (and, for
    /// `usercom`, the writer of an older courier, the preset that replaced it).
    pub fn parse(name: &str) -> Result<Self, Invalid> {
        Self::ALL
            .into_iter()
            .find(|k| k.name() == name)
            .ok_or_else(|| {
                let all: Vec<&str> = Self::ALL.iter().map(|k| k.name()).collect();
                let hint = match name {
                    "usercom" => {
                        " (User.com is the preset usercom: `courier apply --preset usercom`)"
                    }
                    _ => "",
                };
                Invalid::new(
                    "writer",
                    format!("writer {name:?} is not one of {}{hint}", all.join(", ")),
                )
            })
    }

    /// The most records one call may carry, and why no more.
    pub fn max_records_per_call(self) -> (usize, &'static str) {
        match self {
            WriterKind::HttpJson => (
                http::MAX_RECORDS_PER_CALL,
                "the generic HTTP writer sends at most that many records per call",
            ),
        }
    }
}

impl std::fmt::Display for WriterKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Builds the writer a connection asks for, reading its API key from the environment.
pub fn build(
    conn: &Connection,
    client: &reqwest::Client,
) -> Result<Arc<dyn Writer>, WriterConfigError> {
    // The same check as when a connection is saved: one written by plain SQL past that
    // check fails its run once with the reason instead of failing every call.
    check_base_url(&conn.base_url).map_err(|reason| WriterConfigError::Invalid {
        connection: conn.name.clone(),
        reason: format!("base_url {reason}"),
    })?;
    let key = match &conn.api_key_env {
        None => None,
        Some(var) => Some(
            std::env::var(var).map_err(|_| WriterConfigError::MissingKey {
                connection: conn.name.clone(),
                var: var.clone(),
            })?,
        ),
    };
    let kind = WriterKind::parse(&conn.writer).map_err(|reason| WriterConfigError::Invalid {
        connection: conn.name.clone(),
        reason: reason.reason,
    })?;
    match kind {
        WriterKind::HttpJson => Ok(Arc::new(http::HttpJsonWriter::new(conn, client, key)?)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_receipt_keeps_the_standard_rate_limit_headers_and_those_the_signals_name() {
        let mut h = reqwest::header::HeaderMap::new();
        for name in [
            "ratelimit-policy",
            "x-ratelimit-remaining",
            "x-hubspot-ratelimit-max",
            "x-sib-ratelimit-reset",
            "sforce-limit-info",
            "date",
            "set-cookie",
            "authorization",
        ] {
            h.insert(
                reqwest::header::HeaderName::from_static(name),
                reqwest::header::HeaderValue::from_static("1"),
            );
        }
        let signals = crate::ratelimit::signals::RateSignals::parse(Some(&serde_json::json!({
            "quotas": [{"limit": "X-HubSpot-RateLimit-Max", "reset": "x-sib-ratelimit-reset"}],
            "usage": [{"header": "Sforce-Limit-Info", "pattern": "api-usage={used}/{limit}",
                       "window_seconds": 86400}]
        })))
        .unwrap();
        assert_eq!(rate_limit_headers(&h, &Default::default()).len(), 3);
        let kept = rate_limit_headers(&h, &signals);
        let mut names: Vec<&str> = kept.keys().map(|k| k.as_str()).collect();
        names.sort_unstable();
        assert_eq!(
            names,
            [
                "date",
                "ratelimit-policy",
                "sforce-limit-info",
                "x-hubspot-ratelimit-max",
                "x-ratelimit-remaining",
                "x-sib-ratelimit-reset"
            ]
        );
    }

    fn connection(base_url: &str, headers: serde_json::Value) -> Connection {
        Connection {
            id: 1,
            name: "crm".into(),
            writer: "http_json".into(),
            base_url: base_url.into(),
            api_key_env: None,
            headers,
            requests_per_minute: None,
            max_in_flight: 1,
            timeout_ms: 1_000,
            budget_key: "connection:1".into(),
            ..Connection::default()
        }
    }

    #[test]
    fn base_urls_must_be_absolute_http_with_a_host() {
        for good in [
            "https://crm.example.com/api/",
            "http://127.0.0.1:8080",
            "http://[::1]:1/x?y=1",
        ] {
            assert_eq!(check_base_url(good), Ok(()), "{good}");
        }
        for (bad, why) in [
            ("http://", "host"),
            ("http://exa mple/", "blank"),
            ("http://exa\tmple/", "control"),
            ("https://crm.example.com/\r\n", "line break"),
            ("https://crm.example.com/\u{0}", "control"),
            ("HTTPS://crm.example.com/", "http:// or https://"),
            ("mailto:a@b", "http:// or https://"),
            ("/api/", "http:// or https://"),
            ("http://:80/", "host"),
            ("http://user:pw@[::1]:1/x?y=1", "user or password"),
            ("https://good@crm.example.com/", "user or password"),
        ] {
            let e = check_base_url(bad).unwrap_err();
            assert!(e.reason.contains(why), "{bad:?}: {e}");
        }
    }

    #[test]
    fn the_writer_refuses_what_the_door_refuses() {
        let client = reqwest::Client::new();
        let conn = connection("http://", serde_json::json!({}));
        let e = build(&conn, &client).err().expect("refused").to_string();
        assert!(e.contains("\"crm\"") && e.contains("base_url"), "{e}");
        let mut conn = connection("http://h/", serde_json::json!({"X-Key": "a\nSECRET"}));
        // A variable every environment has: the key is read before the headers.
        conn.api_key_env = Some("PATH".into());
        let e = build(&conn, &client).err().expect("refused").to_string();
        assert!(e.contains("X-Key") && e.contains("line break"), "{e}");
        assert!(!e.contains("SECRET"), "{e}");
        let mut conn = connection("http://h/", serde_json::json!({}));
        conn.writer = "usercom".into();
        let e = build(&conn, &client).err().expect("refused").to_string();
        assert!(e.contains("preset usercom"), "{e}");
    }
}
