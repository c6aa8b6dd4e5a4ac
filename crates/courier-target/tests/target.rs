//! The local User.com target itself, over real HTTP on loopback: its limiter (fixed and
//! sliding windows, the three `retry-after` modes), token auth, workspace routing by path
//! prefix and Host, unknown attributes, fault modes and counters. The limiter's timing is
//! unit-tested in `src/limiter.rs` with time as a parameter; here long periods keep
//! every request of a test inside one window without sleeping.

use std::time::{Duration, Instant, SystemTime};

use courier_target::{
    Counters, Faults, RateHeaders, RetryAfterMode, Target, TargetConfig, Window, WorkspaceConfig,
    WorkspaceCounters,
};
use serde_json::{Value, json};

const TOKEN: &str = "t0ken";

async fn start(config: TargetConfig) -> Target {
    Target::start_with(TargetConfig {
        workspaces: vec![WorkspaceConfig::new("shop", TOKEN)],
        ..config
    })
    .await
    .unwrap()
}

async fn upsert(t: &Target, custom_id: &str) -> reqwest::Response {
    reqwest::Client::new()
        .post(format!(
            "{}users/update_or_create/",
            t.workspace_url("shop")
        ))
        .header("authorization", format!("Token {TOKEN}"))
        .json(&json!({"custom_id": custom_id}))
        .send()
        .await
        .unwrap()
}

#[tokio::test]
async fn each_window_kind_refuses_the_request_past_the_limit_with_a_rounded_up_wait() {
    for window in [Window::Fixed, Window::Sliding] {
        // 3 per minute: every request below lands in the first window, however slow the
        // machine, and the wait left is just under 60 s.
        let t = start(TargetConfig {
            rate: 3,
            period: Duration::from_secs(60),
            window,
            ..TargetConfig::default()
        })
        .await;
        for i in 0..3 {
            assert_eq!(
                upsert(&t, &format!("c{i}")).await.status(),
                200,
                "{window:?}"
            );
        }
        let r = upsert(&t, "c3").await;
        assert_eq!(r.status(), 429, "{window:?}");
        assert_eq!(
            r.headers()["retry-after"],
            "60",
            "{window:?}: whole seconds, rounded up"
        );
        let body: Value = r.json().await.unwrap();
        assert_eq!(
            body,
            json!({"detail": "Request was throttled. Expected available in 60 seconds."})
        );
        let c = t.counters();
        assert_eq!((c.throttled, c.workspaces["shop"].throttled), (1, 1));
        assert_eq!(
            c.workspaces["shop"].stored["users"], 3,
            "the refused write was not applied"
        );
    }
}

#[tokio::test]
async fn one_second_windows_say_one_second() {
    let t = start(TargetConfig {
        rate: 2,
        ..TargetConfig::default()
    })
    .await;
    // Requests until the limiter refuses one: at 2/s that is the third within a second.
    let mut statuses = Vec::new();
    let r = loop {
        let r = upsert(&t, "c").await;
        statuses.push(r.status().as_u16());
        if r.status() == 429 || statuses.len() > 10 {
            break r;
        }
    };
    assert_eq!(r.status(), 429, "{statuses:?}");
    assert_eq!(r.headers()["retry-after"], "1");
    let body: Value = r.json().await.unwrap();
    assert_eq!(
        body["detail"],
        "Request was throttled. Expected available in 1 second."
    );
}

#[tokio::test]
async fn retry_after_can_be_a_date_or_absent() {
    let t = start(TargetConfig {
        rate: 1,
        period: Duration::from_secs(60),
        retry_after: RetryAfterMode::HttpDate,
        ..TargetConfig::default()
    })
    .await;
    assert_eq!(upsert(&t, "a").await.status(), 200);
    let before = SystemTime::now();
    let r = upsert(&t, "b").await;
    assert_eq!(r.status(), 429);
    let at = httpdate::parse_http_date(r.headers()["retry-after"].to_str().unwrap()).unwrap();
    let ahead = at.duration_since(before).unwrap();
    assert!(
        ahead > Duration::from_secs(55) && ahead <= Duration::from_secs(61),
        "{ahead:?}"
    );
    t.set_retry_after(RetryAfterMode::None);
    let r = upsert(&t, "c").await;
    assert_eq!(r.status(), 429);
    assert!(r.headers().get("retry-after").is_none());
}

#[tokio::test]
async fn tokens_are_required_and_refusals_cost_no_budget() {
    let t = start(TargetConfig {
        rate: 1,
        period: Duration::from_secs(60),
        ..TargetConfig::default()
    })
    .await;
    let url = format!("{}users/update_or_create/", t.workspace_url("shop"));
    let client = reqwest::Client::new();
    for (auth, detail) in [
        (None, "Authentication credentials were not provided."),
        (Some("Token wrong"), "Invalid token."),
        (Some("Bearer t0ken"), "Invalid token."),
    ] {
        let mut req = client.post(&url).json(&json!({"custom_id": "x"}));
        if let Some(a) = auth {
            req = req.header("authorization", a);
        }
        let r = req.send().await.unwrap();
        assert_eq!(r.status(), 401);
        assert_eq!(r.headers()["www-authenticate"], "Token");
        assert_eq!(r.json::<Value>().await.unwrap(), json!({"detail": detail}));
    }
    assert_eq!(upsert(&t, "x").await.status(), 200, "401s spent no budget");
    assert_eq!(t.counters().workspaces["shop"].unauthorized, 3);
}

#[tokio::test]
async fn workspaces_are_told_apart_by_path_prefix_and_host() {
    let mut other = WorkspaceConfig::new("other", "other-token");
    other.custom_attributes = Some(["email_consent".to_owned()].into());
    let t = Target::start_with(TargetConfig {
        workspaces: vec![WorkspaceConfig::new("shop", TOKEN), other],
        ..TargetConfig::default()
    })
    .await
    .unwrap();
    let client = reqwest::Client::new();
    let by_host = |host: &str, token: &str, body: Value| {
        client
            .post(format!("{}api/public/users/update_or_create/", t.url()))
            .header("host", host)
            .header("authorization", format!("Token {token}"))
            .json(&body)
            .send()
    };
    let r = by_host(
        "other.localhost",
        "other-token",
        json!({"custom_id": "o1", "email_consent": true}),
    )
    .await
    .unwrap();
    assert_eq!(r.status(), 200);
    let r = by_host("other.localhost", TOKEN, json!({"custom_id": "o2"}))
        .await
        .unwrap();
    assert_eq!(r.status(), 401, "shop's token is not other's");
    let r = by_host(
        "other.localhost",
        "other-token",
        json!({"custom_id": "o3", "loyalty": 4}),
    )
    .await
    .unwrap();
    assert_eq!(r.status(), 400, "unknown custom attribute");
    let body: Value = r.json().await.unwrap();
    assert!(
        body["loyalty"][0]
            .as_str()
            .unwrap()
            .contains("does not exist"),
        "{body}"
    );
    assert_eq!(upsert(&t, "s1").await.status(), 200);
    assert_eq!(
        t.workspace_data("other")
            .unwrap()
            .store("users")
            .keys()
            .collect::<Vec<_>>(),
        ["o1"]
    );
    assert_eq!(
        t.workspace_data("shop")
            .unwrap()
            .store("users")
            .keys()
            .collect::<Vec<_>>(),
        ["s1"]
    );
    let r = client
        .post(format!("{}ws/nope/api/public/events/", t.url()))
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    // Without a workspace, any path is the generic JSON sink of the http_json writer.
    let r = client
        .post(format!("{}contacts/", t.url()))
        .header("idempotency-key", "courier-1")
        .json(&json!({"a": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(t.accepted("courier-1"), 1);
}

#[tokio::test]
async fn faults_come_on_demand() {
    let t = start(TargetConfig::default()).await;
    t.set_faults(Faults {
        share_5xx: 1.0,
        ..Faults::default()
    });
    for _ in 0..5 {
        let s = upsert(&t, "c").await.status().as_u16();
        assert!(matches!(s, 500 | 502 | 504), "{s}");
    }

    t.set_faults(Faults {
        reset_share: 1.0,
        ..Faults::default()
    });
    let e = reqwest::Client::new()
        .post(format!(
            "{}users/update_or_create/",
            t.workspace_url("shop")
        ))
        .json(&json!({"custom_id": "c"}))
        .send()
        .await
        .expect_err("the connection is closed without an answer");
    assert!(!e.is_timeout() && !e.is_status(), "{e:?}");

    t.set_faults(Faults {
        hang_share: 1.0,
        ..Faults::default()
    });
    let e = reqwest::Client::new()
        .post(format!(
            "{}users/update_or_create/",
            t.workspace_url("shop")
        ))
        .timeout(Duration::from_millis(200))
        .json(&json!({"custom_id": "c"}))
        .send()
        .await
        .expect_err("hangs past the timeout");
    assert!(e.is_timeout(), "{e:?}");

    t.set_faults(Faults {
        latency: Some((Duration::from_millis(150), Duration::from_millis(200))),
        ..Faults::default()
    });
    let started = Instant::now();
    assert_eq!(upsert(&t, "c").await.status(), 200);
    assert!(started.elapsed() >= Duration::from_millis(150));
    assert_eq!(t.counters().faults, 7);
}

#[tokio::test]
async fn counters_are_served_as_json() {
    let t = start(TargetConfig {
        rate: 2,
        period: Duration::from_secs(60),
        ..TargetConfig::default()
    })
    .await;
    assert_eq!(upsert(&t, "c1").await.status(), 200);
    assert_eq!(upsert(&t, "c1").await.status(), 200);
    assert_eq!(upsert(&t, "c2").await.status(), 429);
    let client = reqwest::Client::new();
    let all: Counters = client
        .get(format!("{}_counters", t.url()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(all.requests, 3, "counter reads are not counted");
    assert_eq!(all.throttled, 1);
    assert_eq!((all.accepted_keys, all.duplicates), (1, 1));
    assert_eq!(all.peak_per_minute, 3);
    assert!(all.peak_per_second >= 1 && all.peak_per_second <= 3);
    assert!(all.max_in_flight >= 1);
    let shop: WorkspaceCounters = client
        .get(format!("{}ws/shop/_counters", t.url()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(shop, all.workspaces["shop"]);
    assert_eq!(
        (
            shop.requests,
            shop.throttled,
            shop.stored["users"],
            shop.duplicates
        ),
        (3, 1, 1, 1)
    );
    assert_eq!(shop.accepted["user:c1"], 2);
}

#[tokio::test]
async fn accepted_writes_are_logged_with_their_arrival() {
    let t = start(TargetConfig::default()).await;
    let before = Instant::now();
    assert_eq!(upsert(&t, "c1").await.status(), 200);
    let between = Instant::now();
    assert_eq!(upsert(&t, "c1").await.status(), 200);
    let after = Instant::now();
    t.respond_with(500, None);
    assert_eq!(upsert(&t, "c2").await.status(), 500);
    let log = t.accepted_log();
    let keys: Vec<&str> = log.iter().map(|w| w.key.as_str()).collect();
    assert_eq!(
        keys,
        ["user:c1", "user:c1"],
        "refused writes are not logged"
    );
    assert!(before <= log[0].arrived && log[0].arrived <= between);
    assert!(between <= log[1].arrived && log[1].arrived <= after);
    assert_eq!(t.in_flight(), 0);
}

#[tokio::test]
async fn gcra_and_token_bucket_refuse_over_http_with_the_gap_as_the_wait() {
    // 3 per minute: GCRA spaces requests 20 s apart, with no burst.
    let t = start(TargetConfig {
        rate: 3,
        period: Duration::from_secs(60),
        window: Window::Gcra,
        ..TargetConfig::default()
    })
    .await;
    assert_eq!(upsert(&t, "c0").await.status(), 200);
    let r = upsert(&t, "c1").await;
    assert_eq!(r.status(), 429);
    assert_eq!(
        r.headers()["retry-after"],
        "20",
        "the remaining gap, rounded up"
    );

    // A token bucket with a burst of 2 at the same rate: two at once, then the gap.
    let t = start(TargetConfig {
        rate: 3,
        period: Duration::from_secs(60),
        window: Window::TokenBucket,
        burst: Some(2),
        ..TargetConfig::default()
    })
    .await;
    for i in 0..2 {
        assert_eq!(upsert(&t, &format!("c{i}")).await.status(), 200);
    }
    let r = upsert(&t, "c2").await;
    assert_eq!(r.status(), 429);
    assert_eq!(r.headers()["retry-after"], "20");
    assert_eq!(t.counters().workspaces["shop"].throttled, 1);
}

#[tokio::test]
async fn rate_headers_state_what_the_limiter_has_left() {
    let t = start(TargetConfig {
        rate: 2,
        period: Duration::from_secs(60),
        rate_headers: RateHeaders::Ietf,
        ..TargetConfig::default()
    })
    .await;
    let r = upsert(&t, "c0").await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["ratelimit-policy"], "\"default\";q=2;w=60");
    assert_eq!(r.headers()["ratelimit"], "\"default\";r=1;t=60");
    let r = upsert(&t, "c1").await;
    assert_eq!(r.headers()["ratelimit"], "\"default\";r=0;t=60");
    let r = upsert(&t, "c2").await;
    assert_eq!(r.status(), 429);
    assert_eq!(r.headers()["ratelimit"], "\"default\";r=0;t=60");
    // Another workspace setting: the common X- fields, the reset as an epoch second.
    assert_eq!(
        t.set_rate_headers(Some("shop"), RateHeaders::XRateLimitEpoch),
        1
    );
    let r = upsert(&t, "c3").await;
    assert_eq!(r.headers()["x-ratelimit-limit"], "2");
    assert_eq!(r.headers()["x-ratelimit-remaining"], "0");
    let epoch: u64 = r.headers()["x-ratelimit-reset"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    assert!((now + 55..=now + 61).contains(&epoch), "{epoch} vs {now}");
    assert!(r.headers().get("ratelimit").is_none());
    // The default sends none, as User.com.
    let t = start(TargetConfig::default()).await;
    let r = upsert(&t, "c0").await;
    assert!(
        !r.headers().keys().any(|k| k.as_str().contains("ratelimit")),
        "{:?}",
        r.headers()
    );
}

#[tokio::test]
async fn the_limit_changes_while_running_by_schedule_and_over_http() {
    // Scheduled from the start: the limit is 1 per minute before the first request.
    let t = start(TargetConfig {
        rate: 3,
        period: Duration::from_secs(60),
        limit_schedule: vec![(Duration::ZERO, 1)],
        ..TargetConfig::default()
    })
    .await;
    assert_eq!(upsert(&t, "c0").await.status(), 200);
    assert_eq!(upsert(&t, "c1").await.status(), 429);
    assert_eq!(t.counters().workspaces["shop"].limit, 1);

    // The admin route: raise it again, read it back, refuse nonsense.
    let client = reqwest::Client::new();
    let r = client
        .post(format!("{}_limit", t.url()))
        .json(&json!({"limit": 3}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.json::<Value>().await.unwrap(), json!({"shop": 3}));
    assert_eq!(upsert(&t, "c2").await.status(), 200, "room again");
    for bad in [json!({"limit": 0}), json!({"limit": "5"}), json!({})] {
        let r = client
            .post(format!("{}ws/shop/_limit", t.url()))
            .json(&bad)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 400, "{bad}");
        let body: Value = r.json().await.unwrap();
        assert!(
            body["limit"][0].as_str().unwrap().contains("whole number"),
            "{body}"
        );
    }
    let r = client
        .get(format!("{}ws/shop/_limit", t.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(r.json::<Value>().await.unwrap(), json!({"shop": 3}));
    assert_eq!(t.set_limit(Some("shop"), 7), 1);
    assert_eq!(t.set_limit(Some("nope"), 7), 0);
    assert_eq!(t.counters().workspaces["shop"].limit, 7);
    assert_eq!(t.counters().requests, 3, "admin calls are not requests");
}

#[tokio::test]
async fn the_batch_sink_answers_per_item_or_all_or_nothing() {
    let t = start(TargetConfig::default()).await;
    let post = |path: &str, key: &str, body: Value| {
        reqwest::Client::new()
            .post(format!("{}{path}", t.url()))
            .header("idempotency-key", key)
            .json(&body)
            .send()
    };
    let items = json!([{"n": 1}, {"n": 2, "invalid": true}, {"n": 3}]);
    let r = post("batch/per-item/", "courier-1,2,3", items.clone())
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let body: Value = r.json().await.unwrap();
    assert_eq!(
        body,
        json!([{"status": 200}, {"status": 400, "error": "invalid record"}, {"status": 200}])
    );
    assert_eq!((t.accepted("courier-1"), t.accepted("courier-2")), (1, 0));

    let r = post("batch/all-or-nothing/", "courier-4,5,6", items)
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    assert_eq!(t.accepted("courier-4"), 0);
    // An envelope: an object with one array field.
    let r = post(
        "batch/all-or-nothing/",
        "courier-4,5",
        json!({"records": [{}, {}]}),
    )
    .await
    .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!((t.accepted("courier-4"), t.accepted("courier-5")), (1, 1));
    let r = post("batch/per-item/", "k", json!({"a": 1, "b": 2}))
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    // Sent again, an item counts twice: duplicates show (1 and 3; 2 was refused before).
    post("batch/per-item/", "courier-1,2,3", json!([{}, {}, {}]))
        .await
        .unwrap();
    assert_eq!(t.accepted("courier-1"), 2);
    assert_eq!(t.counters().duplicates, 2);
}

#[test]
fn every_preset_endpoint_is_emulated_by_the_file_beside_it() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../presets");
    let mut checked = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_str().unwrap().to_owned();
        let Some(preset) = name
            .strip_suffix(".json")
            .filter(|n| !n.ends_with(".target"))
        else {
            continue;
        };
        let file: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let emulation = courier_target::emulation::emulations()
            .iter()
            .find(|(n, _)| *n == preset)
            .map(|(_, e)| e);
        // The vendor's own path prefix (`v3/`), which tells its endpoints apart.
        let base = file["connections"][0]["base_url"].as_str().unwrap();
        let prefix = base.split_once("://").unwrap().1.split_once('/').unwrap().1;
        for rule in file["rules"].as_array().unwrap() {
            // A job rule's endpoints are the job emulation's (courier_target::jobs).
            if rule["job"].is_object() {
                continue;
            }
            // What a record fills in a path (`{payload/custom_id}`) matches any segment.
            let mut rule_path = rule["path"].as_str().unwrap().to_owned();
            while let Some(open) = rule_path.find('{') {
                let close = open + rule_path[open..].find('}').unwrap();
                rule_path.replace_range(open..=close, "*");
            }
            let rule_path = &format!("{prefix}{rule_path}");
            let e = emulation.unwrap_or_else(|| {
                panic!("preset {preset}: rule {} calls a batch endpoint; presets/{preset}.target.json says how it answers", rule["name"])
            });
            // A workspace's operations serve their paths under its prefix.
            let operations = e.workspace.iter().flat_map(|w| {
                w.operations
                    .iter()
                    .map(|op| format!("{}{}", w.prefix, op.path.replace("{key}", "*")))
            });
            let paths: Vec<String> = e.endpoints.iter().flat_map(|ep| ep.paths.clone()).collect();
            assert!(
                paths
                    .into_iter()
                    .chain(operations)
                    .any(|p| courier_target::vendors::path_matches(&p, rule_path)),
                "preset {preset}: no endpoint of {preset}.target.json serves {rule_path}"
            );
            checked += 1;
        }
    }
    assert!(checked >= 12, "{checked} rules checked");
}

#[tokio::test]
async fn a_path_limit_refuses_its_paths_past_each_window_and_leaves_others_alone() {
    let limit = courier_target::PathLimit::parse("**/events=100/s,2/min").unwrap();
    assert_eq!(
        limit.limits,
        [(100, Duration::from_secs(1)), (2, Duration::from_secs(60))]
    );
    for bad in [
        "**/events",
        "**/events=0/s",
        "**/events=5/day",
        "**/events=x/s",
    ] {
        let e = courier_target::PathLimit::parse(bad).unwrap_err();
        assert!(e.contains(bad), "{e}");
    }
    let t = start(TargetConfig {
        path_limits: vec![limit],
        ..TargetConfig::default()
    })
    .await;
    let post = |path: &str| {
        reqwest::Client::new()
            .post(format!("{}{path}", t.url()))
            .json(&json!({"data": {"type": "event"}}))
            .send()
    };
    let statuses = [
        post("api/events").await.unwrap(),
        post("api/events").await.unwrap(),
        post("api/events").await.unwrap(),
    ];
    let got: Vec<u16> = statuses.iter().map(|r| r.status().as_u16()).collect();
    // Klaviyo's create_event answers 202.
    assert_eq!(got, [202, 202, 429]);
    let wait: u64 = statuses[2].headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=60).contains(&wait), "{wait}");
    // Another path is under no limit.
    assert_eq!(post("api/profiles").await.unwrap().status(), 200);
    assert_eq!(t.counters().throttled, 1);
}
