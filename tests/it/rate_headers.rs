//! The engine's rate-header parser reads back what the local target states, over real HTTP,
//! for every limiter kind and header format: the remaining count falls by one per request
//! and is exactly how many more pass before a 429, the reset agrees with the 429's
//! `retry-after`, and the policy states the target's quota. A long period (4 per minute)
//! keeps every request of a test in one window without sleeping.

use std::time::Duration;

use courier::ratelimit::headers::{self as rate_headers, ResetKind, Statement};
use courier_target::{RateHeaders, Target, TargetConfig, Window, WorkspaceConfig};
use serde_json::json;

const TOKEN: &str = "test-token";
const LIMIT: u32 = 4;
const PERIOD: Duration = Duration::from_secs(60);

/// One answer: its status, what it stated, its `retry-after` in seconds.
struct Answer {
    status: u16,
    stated: Statement,
    retry_after: Option<u64>,
}

async fn call(client: &reqwest::Client, t: &Target, i: usize, kind: ResetKind) -> Answer {
    let r = client
        .post(format!(
            "{}users/update_or_create/",
            t.workspace_url("shop")
        ))
        .header("authorization", format!("Token {TOKEN}"))
        .json(&json!({"custom_id": format!("c{i}")}))
        .send()
        .await
        .unwrap();
    Answer {
        status: r.status().as_u16(),
        stated: rate_headers::read(r.headers(), kind, chrono::Utc::now()),
        retry_after: r
            .headers()
            .get("retry-after")
            .map(|v| v.to_str().unwrap().parse().unwrap()),
    }
}

#[tokio::test]
async fn the_parser_reads_back_what_the_target_states() {
    let client = reqwest::Client::new();
    for (window, burst, passes) in [
        (Window::Fixed, None, 4),
        (Window::Sliding, None, 4),
        (Window::Gcra, None, 1),
        (Window::TokenBucket, Some(3), 3),
    ] {
        for (mode, kind) in [
            (RateHeaders::Ietf, ResetKind::Delta),
            (RateHeaders::XRateLimit, ResetKind::Delta),
            (RateHeaders::XRateLimitEpoch, ResetKind::EpochSeconds),
        ] {
            let case = format!("{window:?} burst {burst:?}, {mode:?}");
            let t = Target::start_with(TargetConfig {
                workspaces: vec![WorkspaceConfig::new("shop", TOKEN)],
                rate: LIMIT,
                period: PERIOD,
                window,
                burst,
                rate_headers: mode,
                ..TargetConfig::default()
            })
            .await
            .unwrap();
            let mut answers = Vec::new();
            for i in 0..=passes {
                answers.push(call(&client, &t, i, kind).await);
            }
            let (ok, refused) = answers.split_at(passes);
            for (i, a) in ok.iter().enumerate() {
                assert_eq!(a.status, 200, "{case}: request {i}");
                // Each answer states how many more pass: one fewer each time.
                assert_eq!(
                    a.stated.remaining,
                    Some((passes - 1 - i) as u32),
                    "{case}: request {i}"
                );
                let reset = a.stated.reset.expect("a reset");
                // An epoch second is rounded up: up to a second more.
                assert!(
                    reset <= PERIOD + Duration::from_secs(1),
                    "{case}: {reset:?}"
                );
                match mode {
                    RateHeaders::Ietf => assert_eq!(
                        a.stated.quota_per_minute(),
                        Some(f64::from(LIMIT)),
                        "{case}"
                    ),
                    // X-RateLimit-Limit names no window: a limit, but no rate.
                    _ => assert_eq!(a.stated.quota, None, "{case}"),
                }
            }
            // Nothing remained, and indeed the next is refused; the reset it states is the
            // wait its retry-after names (both whole seconds rounded up, a second apart at
            // most for an epoch read a moment later).
            let r = &refused[0];
            assert_eq!(r.status, 429, "{case}");
            assert_eq!(r.stated.remaining, Some(0), "{case}");
            let reset = r.stated.reset.expect("a reset on the 429").as_secs_f64();
            let retry_after = r.retry_after.expect("retry-after") as f64;
            assert!(
                (reset - retry_after).abs() <= 1.0 && reset > 0.0,
                "{case}: reset {reset} vs retry-after {retry_after}"
            );
            assert_eq!(t.counters().workspaces["shop"].throttled, 1, "{case}");
        }
    }
}

#[tokio::test]
async fn an_epoch_reset_read_as_a_delta_is_ignored_not_a_day_long_block() {
    let t = Target::start_with(TargetConfig {
        workspaces: vec![WorkspaceConfig::new("shop", TOKEN)],
        rate_headers: RateHeaders::XRateLimitEpoch,
        ..TargetConfig::default()
    })
    .await
    .unwrap();
    let a = call(&reqwest::Client::new(), &t, 0, ResetKind::Delta).await;
    assert_eq!(a.status, 200);
    assert_eq!(a.stated.remaining, Some(9));
    assert_eq!(a.stated.reset, None);
}
