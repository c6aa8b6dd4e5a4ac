//! Every budget courier paces, one line each: a connection's, a rule's own (Klaviyo's per
//! endpoint budgets), a job's poll budget; its limits with their use, the pace, the learned
//! and advertised rates, the calls of the last minute, the block in force and who set it,
//! and the rules spending from it. `courier status`, its JSON, the dashboard and the
//! metrics read them from here alone.

use std::collections::{BTreeMap, HashMap};

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgConnection;

use crate::{
    catalog::{Connection, Rule},
    ratelimit::{
        blocks,
        budget::BudgetState,
        controller::PARAMS,
        limits::{self, Limit, usable_quota},
    },
    writer::job::JobShape,
};

/// One budget's line.
#[derive(Clone, Debug, Serialize)]
pub struct BudgetStatus {
    /// Its key.
    pub key: String,
    /// The connection whose calls spend from it.
    pub connection: String,
    /// What it is: `connection`, `rule` (a rule's own) or `polls` (a job's poll budget).
    pub kind: &'static str,
    /// The rules spending from it (`name (polls)` for a job's polls).
    pub rules: Vec<String>,
    /// Each declared limit: its use in its window, and when a spent one frees.
    pub limits: Vec<LimitUse>,
    /// The shortest declared limit, per minute.
    pub declared_rpm: f64,
    /// The rate learned from 429s, while below the declared rate.
    pub learned_rpm: Option<f64>,
    /// The rate the target's rate-limit headers state, while the statement holds.
    pub advertised_rpm: Option<f64>,
    /// The rate it paces at: the least of declared, learned and advertised.
    pub effective_rpm: f64,
    /// Calls made against it in the last 60 s (429s included).
    pub used_last_minute: i64,
    /// The last 429 met on it.
    pub last_429_at: Option<DateTime<Utc>>,
    /// End of the block in force, if one is.
    pub blocked_until: Option<DateTime<Utc>>,
    /// The rule whose call set the block.
    pub blocked_by: Option<String>,
    /// What set it: a 429's `retry-after`, or the target's statement that nothing is left.
    pub block_reason: Option<String>,
}

/// A declared limit's use.
#[derive(Clone, Debug, Serialize)]
pub struct LimitUse {
    /// The limit (`N/window`).
    pub limit: String,
    /// What the budget may spend of it (its quota less the reserve).
    pub quota: u32,
    /// Calls counted in the window ending now; `None` for the shortest window, which is
    /// paced (its slots never exceed it) rather than counted.
    pub used: Option<u32>,
    /// Whether it is spent.
    pub spent: bool,
    /// When a spent window frees (its oldest calls leave it).
    pub frees_at: Option<DateTime<Utc>>,
}

/// Where a budget's pace stands (see [`budget_pace`]).
pub struct Pace {
    /// Each declared limit's use.
    pub limits: Vec<LimitUse>,
    /// The learned rate (requests per minute), while below the declared pace.
    pub learned_rpm: Option<f64>,
    /// The advertised rate, while its statement holds.
    pub advertised_rpm: Option<f64>,
    /// The rate paced at.
    pub effective_rpm: f64,
}

/// A budget's pace at `now` from its shared state: what each limit has used in its window
/// and when that frees, the learned and the effective rate. Status and metrics read it
/// from here alone.
pub fn budget_pace(
    state: &BudgetState,
    declared: &[Limit],
    reserve: u8,
    now: DateTime<Utc>,
) -> Pace {
    let limits = state.limits(declared);
    let pace = limits.first().map_or(f64::MAX, Limit::per_second);
    let effective = state.rate(declared, &PARAMS, now);
    let uses = limits
        .iter()
        .enumerate()
        .map(|(i, l)| {
            let quota = usable_quota(l, reserve);
            // The shortest window is paced, not counted (its slots never exceed it).
            let (used, frees_at) = match state.spent.iter().find(|s| s.limit == *l) {
                Some(s) => s.used(now),
                None => (0, None),
            };
            let spent = i > 0 && used >= quota;
            LimitUse {
                limit: l.to_string(),
                quota,
                used: (i > 0).then_some(used.min(quota)),
                spent,
                frees_at: frees_at.filter(|_| spent),
            }
        })
        .collect();
    Pace {
        limits: uses,
        // As the pace applies it (never under its floor).
        learned_rpm: state
            .learned
            .rate(&PARAMS, pace, now)
            .map(|_| state.learned.pace(&PARAMS, pace, now) * 60.0),
        advertised_rpm: state
            .advertised()
            .iter()
            .map(|l| l.per_second() * 60.0)
            .reduce(f64::min),
        effective_rpm: effective * 60.0,
    }
}

/// What a budget is made of, before its state is read.
struct Spec {
    connection: String,
    kind: &'static str,
    limits: Vec<Limit>,
    reserve: u8,
    rules: Vec<String>,
}

/// Every budget of `connections` and `rules`, by key: each connection's, each rule's own,
/// each job's poll budget (the first to name a key gives its limits).
fn specs(connections: &[Connection], rules: &[Rule]) -> BTreeMap<String, Spec> {
    let mut out: BTreeMap<String, Spec> = BTreeMap::new();
    let by_id: HashMap<i64, &Connection> = connections.iter().map(|c| (c.id, c)).collect();
    for c in connections {
        out.entry(c.budget_key.clone()).or_insert_with(|| Spec {
            connection: c.name.clone(),
            kind: "connection",
            limits: c.declared_limits(),
            reserve: c.reserve(),
            rules: Vec::new(),
        });
    }
    for r in rules {
        let Some(c) = by_id.get(&r.connection_id) else {
            continue;
        };
        let own: Vec<Limit> = r.limits.iter().filter_map(|l| l.parse().ok()).collect();
        let key = r.budget_key.clone().unwrap_or_else(|| c.budget_key.clone());
        let spec = out.entry(key).or_insert_with(|| Spec {
            connection: c.name.clone(),
            kind: "rule",
            limits: match own.is_empty() {
                true => c.declared_limits(),
                false => limits::check(own).unwrap_or_default(),
            },
            reserve: c.reserve(),
            rules: Vec::new(),
        });
        spec.rules.push(r.name.clone());
        let polls = r
            .job
            .as_ref()
            .and_then(|j| JobShape::parse(j).ok()?.poll_budget);
        if let Some(b) = polls {
            let spec = out.entry(b.key).or_insert_with(|| Spec {
                connection: c.name.clone(),
                kind: "polls",
                limits: limits::check(b.limits).unwrap_or_default(),
                reserve: c.reserve(),
                rules: Vec::new(),
            });
            spec.rules.push(format!("{} (polls)", r.name));
        }
    }
    out
}

/// Every budget's line at `now`, in the order of their keys.
pub async fn lines(
    db: &mut PgConnection,
    connections: &[Connection],
    rules: &[Rule],
    now: DateTime<Utc>,
) -> Result<Vec<BudgetStatus>, sqlx::Error> {
    let states = crate::ratelimit::report::states(&mut *db).await?;
    let blocks: HashMap<String, blocks::BlockLine> = (blocks::current(&mut *db, now).await?)
        .into_iter()
        .map(|b| (b.budget_key.clone(), b))
        .collect();
    let used = crate::ratelimit::report::calls_last_minute(&mut *db, now).await?;
    let rule_name = |id: Option<i64>| {
        let id = id?;
        rules.iter().find(|r| r.id == id).map(|r| r.name.clone())
    };
    Ok(specs(connections, rules)
        .into_iter()
        .map(|(key, spec)| {
            let state = states.get(&key).cloned().unwrap_or_default();
            let pace = budget_pace(&state, &spec.limits, spec.reserve, now);
            let block = blocks.get(&key);
            BudgetStatus {
                used_last_minute: used.get(&key).copied().unwrap_or(0),
                declared_rpm: spec.limits.first().map_or(0.0, |l| l.per_second() * 60.0),
                learned_rpm: pace.learned_rpm,
                advertised_rpm: pace.advertised_rpm,
                effective_rpm: pace.effective_rpm,
                limits: pace.limits,
                last_429_at: state.learned.last_429,
                blocked_until: block.map(|b| b.until),
                blocked_by: block.and_then(|b| rule_name(b.rule_id)),
                block_reason: block.and_then(|b| b.retry_after_raw.clone()),
                connection: spec.connection,
                kind: spec.kind,
                rules: spec.rules,
                key,
            }
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_learned_rate_shown_is_the_one_paced_never_under_its_floor() {
        let at = DateTime::from_timestamp(1_800_000_000, 0).unwrap();
        let declared = [Limit::new(10, 1)];
        let mut state = BudgetState::default();
        // Twenty deep cuts in a row: far below 5% of the declared 10/s.
        for i in 0..20 {
            let t = at + chrono::Duration::seconds(i);
            let paced = state.learned.rate(&PARAMS, 10.0, t).unwrap_or(10.0);
            state.refused(&PARAMS, paced, t, t, t + chrono::Duration::seconds(1));
        }
        let now = at + chrono::Duration::seconds(21);
        let pace = budget_pace(&state, &declared, 0, now);
        assert_eq!(pace.learned_rpm, Some(pace.effective_rpm));
        assert!((pace.effective_rpm - 10.0 * PARAMS.floor * 60.0).abs() < 1e-9);
    }
}
