//! Faults injected on demand, for every path: a share of 500/502/504, a uniform latency
//! range, hangs past the client's timeout, connection resets, and a status forced for
//! every request ([`crate::Target::respond_with`]).

use std::{
    sync::{Arc, atomic::Ordering},
    time::Duration,
};

use axum::{
    Json,
    http::StatusCode,
    response::{IntoResponse, Response},
};
use rand::Rng;
use serde::{Deserialize, Serialize};

use crate::{
    DEFAULT_HANG, DropConnection, TargetState, lock,
    server::{InFlight, json_reply},
};

/// Faults injected on demand. Shares are probabilities from 0 to 1, drawn per request.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Faults {
    /// Share of requests answered 500, 502 or 504 (picked evenly).
    pub share_5xx: f64,
    /// Extra latency per request, uniform between the two bounds.
    pub latency: Option<(Duration, Duration)>,
    /// Share of requests that hang for [`Faults::hang_for`] before being handled.
    pub hang_share: f64,
    /// How long a hanging request hangs.
    pub hang_for: Duration,
    /// Share of requests whose connection is closed without an answer.
    pub reset_share: f64,
}

impl Default for Faults {
    fn default() -> Self {
        Self {
            share_5xx: 0.0,
            latency: None,
            hang_share: 0.0,
            hang_for: DEFAULT_HANG,
            reset_share: 0.0,
        }
    }
}

/// Parses a latency range `MIN..MAX` in milliseconds (or a single `N`).
pub fn parse_latency_ms(s: &str) -> Result<(Duration, Duration), String> {
    let (lo, hi) = s.split_once("..").unwrap_or((s, s));
    let ms = |v: &str| {
        v.trim()
            .parse::<u64>()
            .map(Duration::from_millis)
            .map_err(|_| format!("latency must be MIN..MAX in milliseconds, not {s:?}"))
    };
    let (lo, hi) = (ms(lo)?, ms(hi)?);
    if lo > hi {
        return Err(format!("latency {s:?}: MIN is above MAX"));
    }
    Ok((lo, hi))
}

/// Latency, then faults, then a forced status, as a proxy in front of the app would add
/// them: the answer a fault gives instead of the app's, if one does. The request counts
/// as in flight meanwhile.
pub(crate) async fn injected(s: &Arc<TargetState>, workspace: Option<&str>) -> Option<Response> {
    let _in_flight = InFlight::enter(s);
    let faults = lock(&s.faults).clone();
    let mut delay = Duration::from_millis(s.latency_ms.load(Ordering::SeqCst));
    if let Some((lo, hi)) = faults.latency {
        delay += if hi > lo {
            rand::rng().random_range(lo..=hi)
        } else {
            lo
        };
    }
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    let fault = |s: &TargetState| {
        let mut inner = lock(&s.inner);
        inner.faults += 1;
        if let Some(w) = workspace.and_then(|n| inner.workspaces.get_mut(n)) {
            w.counters.faults += 1;
        }
    };
    let draw = |share: f64| share > 0.0 && rand::rng().random_bool(share.clamp(0.0, 1.0));
    if draw(faults.reset_share) {
        fault(s);
        let mut r = StatusCode::INTERNAL_SERVER_ERROR.into_response();
        r.extensions_mut().insert(DropConnection);
        return Some(r);
    }
    if draw(faults.hang_share) {
        fault(s);
        tokio::time::sleep(faults.hang_for).await;
    }
    if draw(faults.share_5xx) {
        fault(s);
        let status = [500, 502, 504][rand::rng().random_range(0..3)];
        return Some(json_reply(
            status,
            serde_json::json!({"detail": "injected failure"}),
        ));
    }
    let forced = s.status.load(Ordering::SeqCst);
    if forced != 0 && !(200..300).contains(&forced) {
        return Some(forced_response(s, forced, workspace));
    }
    None
}

/// The answer [`Target::respond_with`] forced.
pub(crate) fn forced_response(s: &TargetState, status: u16, workspace: Option<&str>) -> Response {
    if status == 429 {
        let mut inner = lock(&s.inner);
        inner.throttled += 1;
        if let Some(w) = workspace.and_then(|n| inner.workspaces.get_mut(n)) {
            w.counters.throttled += 1;
        }
        drop(inner);
        let retry_after = lock(&s.retry_after).clone();
        let body = Json(serde_json::json!({"detail": "Request was throttled."}));
        return if retry_after.is_empty() {
            (StatusCode::TOO_MANY_REQUESTS, body).into_response()
        } else {
            (
                StatusCode::TOO_MANY_REQUESTS,
                [("retry-after", retry_after)],
                body,
            )
                .into_response()
        };
    }
    let detail = match status {
        401 => "Invalid token.",
        403 => "You do not have permission to perform this action.",
        404 => "Not found.",
        _ => "injected failure",
    };
    json_reply(status, serde_json::json!({ "detail": detail }))
}
