//! Target connections and rules (tables `connections` and `rules`): creating and listing
//! them. What is saved here is checked first, so a mistake is refused with a message that
//! names the connection or rule, the field and the problem, instead of failing later at
//! delivery: a base URL must be an absolute http(s) URL with a host, headers real HTTP
//! headers, a rule's profile (path, request shape, answer map) one that reads. SQL users
//! may insert into both tables directly; check constraints there refuse what SQL can check
//! cheaply (the URL's shape, the headers), and a rule whose profile does not read fails its
//! run once with the reason, leaving its backlog pending.

use chrono::{DateTime, Utc};
use sqlx::{Acquire, PgConnection, PgExecutor, Postgres};

pub use crate::model::{
    Connection, NewConnection, NewRule, Rule, is_variable_name, rpm_or_default,
};
use crate::{
    config::redact_url,
    profile::{self, RuleProfile},
    ratelimit::limits,
    writer::{self, WriterKind},
};

/// Why a connection or rule could not be stored.
#[derive(Debug, thiserror::Error)]
pub enum CatalogError {
    /// The input broke a rule of the schema.
    #[error("{0}")]
    Invalid(String),
    /// No connection or rule has that name.
    #[error("no {kind} named {name:?}")]
    NotFound {
        /// `connection` or `rule`.
        kind: &'static str,
        /// The name asked for.
        name: String,
    },
    /// The database refused.
    #[error(transparent)]
    Sql(#[from] sqlx::Error),
}

/// Turns a constraint violation into a readable error naming what was wrong.
fn explain(e: sqlx::Error, what: &str) -> CatalogError {
    if let Some(constraint) = e.as_database_error().and_then(|db| db.constraint()) {
        return CatalogError::Invalid(format!("{what}: violates {constraint}"));
    }
    CatalogError::Sql(e)
}

/// Checks a connection before it is saved: its writer kind, its key variable's name, its
/// base URL and its headers. The error names the
/// connection, the field and the problem; it never repeats a header's value nor a password
/// in the URL.
pub fn check_connection(c: &NewConnection) -> Result<(), CatalogError> {
    let invalid = |what: String| CatalogError::Invalid(format!("connection {:?}: {what}", c.name));
    WriterKind::parse(&c.writer).map_err(|e| invalid(e.reason))?;
    match c.api_key_env.as_deref() {
        // Not echoed: a key given in place of its variable's name would be.
        Some(var) if !is_variable_name(var) => {
            return Err(invalid(
                "api_key_env is not the name of an environment variable (letters, digits and \
                 _, not starting with a digit); it names the variable holding the key, never \
                 the key itself"
                    .into(),
            ));
        }
        _ => {}
    }
    writer::check_base_url(&c.base_url).map_err(|reason| {
        invalid(format!(
            "base_url {:?} {reason} (expected an absolute URL such as \
             https://crm.example.com/api/)",
            redact_url(&c.base_url)
        ))
    })?;
    writer::endpoint::header_map(&serde_json::Value::Object(c.headers.clone()))
        .map_err(|e| invalid(e.reason))?;
    let auth = writer::auth::Auth::parse(c.auth.as_ref()).map_err(|e| invalid(e.reason))?;
    crate::ratelimit::signals::RateSignals::parse(c.rate_signals.as_ref())
        .map_err(|e| invalid(e.reason))?;
    if let Some(erase) = &c.erase {
        writer::erase::EraseShape::parse(erase).map_err(|e| invalid(e.reason))?;
    }
    if matches!(auth, writer::auth::Auth::Oauth { .. }) && c.api_key_env.is_none() {
        return Err(invalid(
            "auth kind oauth needs api_key_env (the variable holding the client secret)".into(),
        ));
    }
    limits::check(c.limits.clone()).map_err(|e| invalid(e.to_string()))?;
    if let Some(r) = &c.reserve {
        limits::parse_reserve(r).map_err(|e| invalid(e.to_string()))?;
    }
    if c.requests_per_minute.is_some_and(|r| r < 1) {
        return Err(invalid("requests_per_minute must be at least 1".into()));
    }
    Ok(())
}

/// Creates a connection, or updates the one with the same name; returns its id. It is
/// checked first ([`check_connection`]); changing its writer is refused while one of its
/// rules has a path the new writer cannot serve (the error names the rule).
pub async fn upsert_connection<'c>(
    db: impl Acquire<'c, Database = Postgres>,
    c: &NewConnection,
) -> Result<i64, CatalogError> {
    check_connection(c)?;
    let mut tx = db.begin().await?;
    let id = save_connection(&mut tx, c).await?;
    check_rules_of(&mut tx, &[c]).await?;
    tx.commit().await?;
    Ok(id)
}

async fn save_connection(db: &mut PgConnection, c: &NewConnection) -> Result<i64, CatalogError> {
    sqlx::query_scalar!(
        r#"INSERT INTO connections
             (name, writer, base_url, api_key_env, headers, requests_per_minute, max_in_flight,
              timeout_ms, budget_key, limits, reserve_percent, auth, rate_signals, erase)
           VALUES ($1, $2, $3, $4, $5, $6, COALESCE($7, 8), COALESCE($8, 10000), $9, $10, $11,
                   $12, $13, $14)
           ON CONFLICT (name) DO UPDATE SET
             writer = EXCLUDED.writer, base_url = EXCLUDED.base_url,
             api_key_env = EXCLUDED.api_key_env, headers = EXCLUDED.headers,
             requests_per_minute = EXCLUDED.requests_per_minute,
             max_in_flight = EXCLUDED.max_in_flight, timeout_ms = EXCLUDED.timeout_ms,
             budget_key = EXCLUDED.budget_key, limits = EXCLUDED.limits,
             reserve_percent = EXCLUDED.reserve_percent, auth = EXCLUDED.auth,
             rate_signals = EXCLUDED.rate_signals, erase = EXCLUDED.erase, updated_at = now()
           RETURNING id"#,
        c.name,
        c.writer,
        c.base_url,
        c.api_key_env,
        serde_json::Value::Object(c.headers.clone()),
        c.requests_per_minute,
        c.max_in_flight,
        c.timeout_ms,
        c.budget_key,
        &c.limits.iter().map(ToString::to_string).collect::<Vec<_>>(),
        i16::from(
            c.reserve
                .as_deref()
                .map_or(Ok(0), limits::parse_reserve)
                .unwrap_or(0)
        ),
        c.auth,
        c.rate_signals,
        c.erase,
    )
    .fetch_one(db)
    .await
    .map_err(|e| explain(e, &format!("connection {:?}", c.name)))
}

/// Refuses the first of `connections` (as saved) whose writer cannot serve one of its
/// rules' paths, naming every such rule; one statement for all of them.
async fn check_rules_of(
    db: &mut PgConnection,
    connections: &[&NewConnection],
) -> Result<(), CatalogError> {
    let names: Vec<&str> = connections.iter().map(|c| c.name.as_str()).collect();
    let rules = sqlx::query!(
        "SELECT c.name AS connection, r.name, r.path, r.records_per_call, r.answer, r.request,
                r.job
         FROM rules r JOIN connections c ON c.id = r.connection_id
         WHERE c.name = ANY($1) ORDER BY r.name",
        &names as &[&str]
    )
    .fetch_all(db)
    .await?;
    for c in connections {
        let bad: Vec<String> = rules
            .iter()
            .filter(|r| r.connection == c.name)
            .filter_map(|r| {
                RuleProfile::parse(profile::Stored {
                    writer: &c.writer,
                    path: &r.path,
                    records_per_call: r.records_per_call,
                    request: r.request.as_ref(),
                    answer: r.answer.as_ref(),
                    job: r.job.as_ref(),
                })
                .err()
                .map(|e| format!("rule {:?} (path {:?}): {e}", r.name, r.path))
            })
            .collect();
        if !bad.is_empty() {
            return Err(CatalogError::Invalid(format!(
                "connection {:?}: writer {} cannot serve {} of its rules; change their paths \
                 first (or in the same `courier apply` file): {}",
                c.name,
                c.writer,
                bad.len(),
                bad.join("; ")
            )));
        }
    }
    Ok(())
}

/// Creates a rule, or updates the one with the same name; returns its id. Its profile is
/// parsed against its connection's writer first ([`RuleProfile::parse`]): its request and
/// answer must read.
pub async fn upsert_rule<'c>(
    db: impl Acquire<'c, Database = Postgres>,
    r: &NewRule,
) -> Result<i64, CatalogError> {
    let mut tx = db.begin().await?;
    // FOR SHARE: the connection's writer cannot change under the check (an update of the
    // connection waits, then checks this rule in turn).
    let writer = sqlx::query_scalar!(
        "SELECT writer FROM connections WHERE name = $1 FOR SHARE",
        r.connection
    )
    .fetch_optional(&mut *tx)
    .await?
    .ok_or_else(|| CatalogError::NotFound {
        kind: "connection",
        name: r.connection.clone(),
    })?;
    check_rule(r, &writer)?;
    let id = sqlx::query_scalar!(
        r#"INSERT INTO rules
             (name, connection_id, path, batch_size, max_attempts, backoff_base_ms, backoff_max_ms,
              enabled, weight, records_per_call, budget_key, answer, request, limits, job,
              identities)
           SELECT $1, c.id, $3, COALESCE($4, 100), COALESCE($5, 5), COALESCE($6, 1000),
                  COALESCE($7, 3600000), COALESCE($8, true), COALESCE($9, 1), COALESCE($10, 1), $11,
                  $12, $13, $14, $15, $16
           FROM connections c WHERE c.name = $2
           ON CONFLICT (name) DO UPDATE SET
             connection_id = EXCLUDED.connection_id, path = EXCLUDED.path,
             batch_size = EXCLUDED.batch_size, max_attempts = EXCLUDED.max_attempts,
             backoff_base_ms = EXCLUDED.backoff_base_ms, backoff_max_ms = EXCLUDED.backoff_max_ms,
             enabled = EXCLUDED.enabled, weight = EXCLUDED.weight,
             records_per_call = EXCLUDED.records_per_call,
             budget_key = EXCLUDED.budget_key,
             answer = EXCLUDED.answer, request = EXCLUDED.request, limits = EXCLUDED.limits,
             job = EXCLUDED.job, identities = EXCLUDED.identities,
             updated_at = now()
           RETURNING id"#,
        r.name,
        r.connection,
        r.path,
        r.batch_size,
        r.max_attempts,
        r.backoff_base_ms,
        r.backoff_max_ms,
        r.enabled,
        r.weight,
        r.records_per_call,
        r.budget_key,
        r.answer,
        r.request,
        &r.limits.iter().map(ToString::to_string).collect::<Vec<_>>(),
        r.job,
        r.identities,
    )
    .fetch_one(&mut *tx)
    .await
    .map_err(|e| explain(e, &format!("rule {:?}", r.name)))?;
    tx.commit().await?;
    Ok(id)
}

/// Checks a rule's `identities`: each a person's identity kind
/// ([`writer::erase::KINDS`]) naming a JSON pointer into its payloads.
pub fn check_identities(identities: Option<&serde_json::Value>) -> Result<(), String> {
    let Some(identities) = identities else {
        return Ok(());
    };
    let kinds = writer::erase::KINDS.join(", ");
    let map = identities
        .as_object()
        .ok_or_else(|| format!("identities must be an object of kind -> JSON pointer ({kinds})"))?;
    for (kind, pointer) in map {
        if !writer::erase::KINDS.contains(&kind.as_str()) {
            return Err(format!("identities: {kind:?} is not one of {kinds}"));
        }
        match pointer.as_str() {
            Some(p) if p.starts_with('/') => {}
            _ => {
                return Err(format!(
                    "identities: {kind}: {pointer} is not a JSON pointer into the payload \
                     (\"/email\")"
                ));
            }
        }
    }
    Ok(())
}

/// Checks rule `r` against its connection's `writer`: its profile parses
/// ([`RuleProfile::parse`]) and its own limits hold ([`check_rule_limits`]).
fn check_rule(r: &NewRule, writer: &str) -> Result<(), CatalogError> {
    RuleProfile::parse(profile::Stored {
        writer,
        path: &r.path,
        records_per_call: r.records_per_call.unwrap_or(1),
        request: r.request.as_ref(),
        answer: r.answer.as_ref(),
        job: r.job.as_ref(),
    })
    .map_err(|e| e.to_string())
    .and_then(|_| check_rule_limits(r))
    .and_then(|_| check_identities(r.identities.as_ref()))
    .map_err(|e| {
        CatalogError::Invalid(format!(
            "rule {:?} on connection {:?} (writer {writer}): {e}",
            r.name, r.connection
        ))
    })
}

/// Checks a rule's own limits: valid limits ([`limits::check`]), and only on a budget of
/// its own (its connection's budget keeps its connection's limits).
fn check_rule_limits(r: &NewRule) -> Result<(), String> {
    if r.limits.is_empty() {
        return Ok(());
    }
    if r.budget_key.is_none() {
        return Err(
            "limits need a budget_key of the rule's own (the connection's budget keeps the \
             connection's limits)"
                .into(),
        );
    }
    limits::check(r.limits.clone())
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// Turns a rule on or off.
pub async fn set_rule_enabled(
    db: impl PgExecutor<'_>,
    name: &str,
    enabled: bool,
) -> Result<(), CatalogError> {
    // Enabling wakes the dispatchers (the trigger rules_resumed), so the rule starts at once.
    let n = sqlx::query!(
        "UPDATE rules SET enabled = $2, updated_at = now() WHERE name = $1",
        name,
        enabled
    )
    .execute(db)
    .await?
    .rows_affected();
    if n == 0 {
        return Err(CatalogError::NotFound {
            kind: "rule",
            name: name.to_owned(),
        });
    }
    Ok(())
}

/// What an operator pauses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Paused {
    /// One rule.
    Rule,
    /// A connection, and so every rule of it.
    Connection,
}

impl Paused {
    /// `rule` or `connection`.
    pub fn kind(self) -> &'static str {
        match self {
            Paused::Rule => "rule",
            Paused::Connection => "connection",
        }
    }
}

/// Sets the `paused` column of the rule or connection named `name`; returns what it was
/// before, or `None` when there is none of that name.
pub async fn set_paused(
    tx: &mut sqlx::PgConnection,
    what: Paused,
    name: &str,
    paused: bool,
) -> Result<Option<bool>, sqlx::Error> {
    // The old value under a row lock, then the change only when it is one.
    let was = match what {
        Paused::Rule => {
            sqlx::query_scalar!("SELECT paused FROM rules WHERE name = $1 FOR UPDATE", name)
                .fetch_optional(&mut *tx)
                .await?
        }
        Paused::Connection => {
            sqlx::query_scalar!(
                "SELECT paused FROM connections WHERE name = $1 FOR UPDATE",
                name
            )
            .fetch_optional(&mut *tx)
            .await?
        }
    };
    if was.is_some_and(|w| w != paused) {
        match what {
            Paused::Rule => {
                sqlx::query!(
                    "UPDATE rules SET paused = $2, updated_at = now() WHERE name = $1",
                    name,
                    paused
                )
                .execute(&mut *tx)
                .await?
            }
            Paused::Connection => {
                sqlx::query!(
                    "UPDATE connections SET paused = $2, updated_at = now() WHERE name = $1",
                    name,
                    paused
                )
                .execute(&mut *tx)
                .await?
            }
        };
    }
    Ok(was)
}

/// Marks rule `rule_id` unusable until `until` (its writer cannot serve its path): the
/// dispatcher leaves it alone meanwhile, unless the catalog changes first (a trigger
/// clears the mark).
pub async fn set_rule_unusable(
    db: impl PgExecutor<'_>,
    rule_id: i64,
    error: &str,
    until: chrono::DateTime<chrono::Utc>,
) -> Result<(), sqlx::Error> {
    sqlx::query!(
        "UPDATE rules SET unusable_error = $2, unusable_until = $3 WHERE id = $1",
        rule_id,
        error,
        until
    )
    .execute(db)
    .await?;
    Ok(())
}

/// All connections, by name.
pub async fn list_connections(db: impl PgExecutor<'_>) -> Result<Vec<Connection>, sqlx::Error> {
    sqlx::query_as!(
        Connection,
        r#"SELECT id, name, writer, base_url, api_key_env, auth, headers, requests_per_minute,
                  max_in_flight, timeout_ms, courier_budget_key(connections) AS "budget_key!",
                  limits, reserve_percent, paused, rate_signals
           FROM connections ORDER BY name"#
    )
    .fetch_all(db)
    .await
}

/// The connection with id `id`, if there is one.
pub async fn connection(
    db: impl PgExecutor<'_>,
    id: i64,
) -> Result<Option<Connection>, sqlx::Error> {
    sqlx::query_as!(
        Connection,
        r#"SELECT id, name, writer, base_url, api_key_env, auth, headers, requests_per_minute,
                  max_in_flight, timeout_ms, courier_budget_key(connections) AS "budget_key!",
                  limits, reserve_percent, paused, rate_signals
           FROM connections WHERE id = $1"#,
        id
    )
    .fetch_optional(db)
    .await
}

/// All rules, by name.
pub async fn list_rules(db: impl PgExecutor<'_>) -> Result<Vec<Rule>, sqlx::Error> {
    sqlx::query_as!(
        Rule,
        "SELECT id, name, connection_id, path, enabled, batch_size, max_attempts,
                backoff_base_ms, backoff_max_ms, weight, records_per_call,
                budget_key, limits, answer, request, job, paused
         FROM rules ORDER BY name"
    )
    .fetch_all(db)
    .await
}

/// The id of the rule named `name`, if there is one.
pub async fn rule_id(db: impl PgExecutor<'_>, name: &str) -> Result<Option<i64>, sqlx::Error> {
    sqlx::query_scalar!("SELECT id FROM rules WHERE name = $1", name)
        .fetch_optional(db)
        .await
}

/// The budget key of the connection named `name`, if there is one.
pub async fn budget_key_of(
    db: impl PgExecutor<'_>,
    name: &str,
) -> Result<Option<String>, sqlx::Error> {
    sqlx::query_scalar!(
        r#"SELECT courier_budget_key(c) AS "key!" FROM connections c WHERE c.name = $1"#,
        name
    )
    .fetch_optional(db)
    .await
}

/// Rule `rule_id` and the connection it delivers into, whose budget key is the one the
/// rule spends from (its own, if it has one); `None` when the rule is gone.
pub async fn rule_with_connection(
    db: impl PgExecutor<'_>,
    rule_id: i64,
) -> Result<Option<(Rule, Connection)>, sqlx::Error> {
    let row = sqlx::query!(
        r#"SELECT ru.id, ru.name AS rule_name, ru.connection_id, ru.path, ru.enabled, ru.batch_size,
                  ru.max_attempts, ru.backoff_base_ms, ru.backoff_max_ms, ru.weight,
                  ru.records_per_call, ru.budget_key AS rule_budget_key,
                  ru.limits AS rule_limits,
                  ru.answer, ru.request, ru.job, ru.paused AS rule_paused,
                  c.name, c.writer, c.base_url, c.api_key_env, c.auth, c.headers,
                  c.requests_per_minute, c.max_in_flight, c.timeout_ms,
                  courier_rule_budget_key(ru, c) AS "budget_key!",
                  CASE WHEN cardinality(ru.limits) > 0 THEN ru.limits ELSE c.limits END
                      AS "limits!", c.reserve_percent,
                  c.paused, c.rate_signals
           FROM rules ru JOIN connections c ON c.id = ru.connection_id
           WHERE ru.id = $1"#,
        rule_id
    )
    .fetch_optional(db)
    .await?;
    Ok(row.map(|r| {
        let rule = Rule {
            id: r.id,
            name: r.rule_name,
            connection_id: r.connection_id,
            path: r.path,
            enabled: r.enabled,
            batch_size: r.batch_size,
            max_attempts: r.max_attempts,
            backoff_base_ms: r.backoff_base_ms,
            backoff_max_ms: r.backoff_max_ms,
            weight: r.weight,
            records_per_call: r.records_per_call,
            budget_key: r.rule_budget_key,
            limits: r.rule_limits,
            answer: r.answer,
            request: r.request,
            job: r.job,
            paused: r.rule_paused,
        };
        let connection = Connection {
            id: r.connection_id,
            name: r.name,
            writer: r.writer,
            base_url: r.base_url,
            api_key_env: r.api_key_env,
            auth: r.auth,
            headers: r.headers,
            requests_per_minute: r.requests_per_minute,
            max_in_flight: r.max_in_flight,
            timeout_ms: r.timeout_ms,
            budget_key: r.budget_key,
            limits: r.limits,
            reserve_percent: r.reserve_percent,
            paused: r.paused,
            rate_signals: r.rate_signals,
        };
        (rule, connection)
    }))
}

/// The rules of connections `connection_ids` that may start a run at `now`
/// (`courier_rule_startable`: enabled, not paused, not left alone as unusable, not blocked,
/// no active run, a due delivery).
pub async fn startable_rules(
    db: impl PgExecutor<'_>,
    connection_ids: &[i64],
    now: DateTime<Utc>,
) -> Result<Vec<i64>, sqlx::Error> {
    sqlx::query_scalar!(
        "SELECT r.id FROM rules r JOIN connections k ON k.id = r.connection_id
         WHERE r.connection_id = ANY($1) AND courier_rule_startable(r, k, $2)",
        connection_ids,
        now
    )
    .fetch_all(db)
    .await
}

/// Of each connection of `connection_ids`, its startable rule with the lowest id (see
/// [`startable_rules`]): `(connection, rule)`.
pub async fn first_startable_rules(
    db: impl PgExecutor<'_>,
    connection_ids: &[i64],
    now: DateTime<Utc>,
) -> Result<Vec<(i64, i64)>, sqlx::Error> {
    Ok(sqlx::query!(
        "SELECT DISTINCT ON (r.connection_id) r.connection_id, r.id
         FROM rules r JOIN connections k ON k.id = r.connection_id
         WHERE r.connection_id = ANY($1) AND courier_rule_startable(r, k, $2)
         ORDER BY r.connection_id, r.id",
        connection_ids,
        now
    )
    .fetch_all(db)
    .await?
    .into_iter()
    .map(|r| (r.connection_id, r.id))
    .collect())
}

/// When the first rule left alone as unusable at `now` is tried again.
pub async fn next_usable(
    db: impl PgExecutor<'_>,
    now: DateTime<Utc>,
) -> Result<Option<DateTime<Utc>>, sqlx::Error> {
    sqlx::query_scalar!(
        "SELECT courier_ts(min(unusable_until)) FROM rules WHERE unusable_until > $1",
        now
    )
    .fetch_one(db)
    .await
}

/// The rules left alone as unusable at `now`: `(rule, why, until when)`.
pub async fn unusable_rules(
    db: impl PgExecutor<'_>,
    now: DateTime<Utc>,
) -> Result<Vec<(String, String, DateTime<Utc>)>, sqlx::Error> {
    Ok(sqlx::query!(
        r#"SELECT name, unusable_error AS "reason!", unusable_until AS "until!"
           FROM rules WHERE unusable_until > $1"#,
        now
    )
    .fetch_all(db)
    .await?
    .into_iter()
    .map(|r| (r.name, r.reason, r.until))
    .collect())
}

/// Checks and saves connections and rules together inside the caller's transaction, as
/// [`upsert_connection`] and [`upsert_rule`] check them; the connections' rules are checked
/// against their writers after the rules are saved, so one change may alter a
/// connection's writer and its rules' paths together.
pub async fn save_all(
    tx: &mut PgConnection,
    connections: &[NewConnection],
    rules: &[NewRule],
) -> Result<(), CatalogError> {
    for c in connections {
        check_connection(c)?;
    }
    for c in connections {
        save_connection(&mut *tx, c).await?;
    }
    for r in rules {
        upsert_rule(&mut *tx, r).await?;
    }
    check_rules_of(tx, &connections.iter().collect::<Vec<_>>()).await
}

/// [`save_all`] in bulk, for catalogs of thousands: checked as it checks them, saved in a
/// statement per table (the rows as one JSON array, read by `jsonb_to_recordset`) rather
/// than one per row, inside the caller's transaction. Names must be unique in the call.
pub async fn save_many(
    tx: &mut PgConnection,
    connections: &[NewConnection],
    rules: &[NewRule],
) -> Result<(), CatalogError> {
    for c in connections {
        check_connection(c)?;
    }
    save_connections(&mut *tx, connections).await?;
    let mut names: Vec<&str> = rules.iter().map(|r| r.connection.as_str()).collect();
    names.sort_unstable();
    names.dedup();
    // FOR SHARE, as upsert_rule: the writers cannot change under the checks.
    let writers: std::collections::HashMap<String, String> = sqlx::query!(
        "SELECT name, writer FROM connections WHERE name = ANY($1) FOR SHARE",
        &names as &[&str]
    )
    .fetch_all(&mut *tx)
    .await?
    .into_iter()
    .map(|c| (c.name, c.writer))
    .collect();
    for r in rules {
        let writer = writers
            .get(&r.connection)
            .ok_or_else(|| CatalogError::NotFound {
                kind: "connection",
                name: r.connection.clone(),
            })?;
        check_rule(r, writer)?;
    }
    save_rules(&mut *tx, rules).await?;
    check_rules_of(tx, &connections.iter().collect::<Vec<_>>()).await
}

/// Saves `connections` (checked) in one statement, as [`save_connection`] saves one.
async fn save_connections(
    db: &mut PgConnection,
    connections: &[NewConnection],
) -> Result<(), CatalogError> {
    let rows: Vec<serde_json::Value> = connections
        .iter()
        .map(|c| {
            let mut row = serde_json::to_value(c).expect("a connection serializes");
            let reserve = c.reserve.as_deref().map_or(Ok(0), limits::parse_reserve);
            row["reserve_percent"] = i16::from(reserve.unwrap_or(0)).into();
            row
        })
        .collect();
    sqlx::query!(
        "INSERT INTO connections
           (name, writer, base_url, api_key_env, headers, requests_per_minute, max_in_flight,
            timeout_ms, budget_key, limits, reserve_percent, auth, rate_signals, erase)
         SELECT x.name, x.writer, x.base_url, x.api_key_env, x.headers, x.requests_per_minute,
                COALESCE(x.max_in_flight, 8), COALESCE(x.timeout_ms, 10000), x.budget_key,
                x.limits, x.reserve_percent, x.auth, x.rate_signals, x.erase
         FROM jsonb_to_recordset($1) AS x(
             name text, writer text, base_url text, api_key_env text, headers jsonb,
             requests_per_minute int, max_in_flight int, timeout_ms int, budget_key text,
             limits text[], reserve_percent smallint, auth jsonb, rate_signals jsonb,
             erase jsonb)
         ON CONFLICT (name) DO UPDATE SET
           writer = EXCLUDED.writer, base_url = EXCLUDED.base_url,
           api_key_env = EXCLUDED.api_key_env, headers = EXCLUDED.headers,
           requests_per_minute = EXCLUDED.requests_per_minute,
           max_in_flight = EXCLUDED.max_in_flight, timeout_ms = EXCLUDED.timeout_ms,
           budget_key = EXCLUDED.budget_key, limits = EXCLUDED.limits,
           reserve_percent = EXCLUDED.reserve_percent, auth = EXCLUDED.auth,
           rate_signals = EXCLUDED.rate_signals, erase = EXCLUDED.erase, updated_at = now()",
        serde_json::Value::Array(rows)
    )
    .execute(db)
    .await
    .map_err(|e| explain(e, "connections"))?;
    Ok(())
}

/// Saves `rules` (checked) in one statement, as [`upsert_rule`] saves one.
async fn save_rules(db: &mut PgConnection, rules: &[NewRule]) -> Result<(), CatalogError> {
    sqlx::query!(
        "INSERT INTO rules
           (name, connection_id, path, batch_size, max_attempts, backoff_base_ms, backoff_max_ms,
            enabled, weight, records_per_call, budget_key, answer, request, limits, job,
            identities)
         SELECT x.name, c.id, x.path, COALESCE(x.batch_size, 100), COALESCE(x.max_attempts, 5),
                COALESCE(x.backoff_base_ms, 1000), COALESCE(x.backoff_max_ms, 3600000),
                COALESCE(x.enabled, true), COALESCE(x.weight, 1), COALESCE(x.records_per_call, 1),
                x.budget_key, x.answer, x.request, x.limits, x.job, x.identities
         FROM jsonb_to_recordset($1) AS x(
             name text, connection text, path text, batch_size int, max_attempts int,
             backoff_base_ms int, backoff_max_ms int, enabled boolean, weight int,
             records_per_call int, budget_key text, answer jsonb, request jsonb, limits text[],
             job jsonb, identities jsonb)
         JOIN connections c ON c.name = x.connection
         ON CONFLICT (name) DO UPDATE SET
           connection_id = EXCLUDED.connection_id, path = EXCLUDED.path,
           batch_size = EXCLUDED.batch_size, max_attempts = EXCLUDED.max_attempts,
           backoff_base_ms = EXCLUDED.backoff_base_ms, backoff_max_ms = EXCLUDED.backoff_max_ms,
           enabled = EXCLUDED.enabled, weight = EXCLUDED.weight,
           records_per_call = EXCLUDED.records_per_call, budget_key = EXCLUDED.budget_key,
           answer = EXCLUDED.answer, request = EXCLUDED.request, limits = EXCLUDED.limits,
           job = EXCLUDED.job, identities = EXCLUDED.identities, updated_at = now()",
        serde_json::to_value(rules).expect("rules serialize")
    )
    .execute(db)
    .await
    .map_err(|e| explain(e, "rules"))?;
    Ok(())
}

/// The connection named `name` as it would be given to save it again, if there is one.
pub async fn given_connection(
    db: &mut PgConnection,
    name: &str,
) -> Result<Option<NewConnection>, sqlx::Error> {
    let row = sqlx::query!(
        "SELECT name, writer, base_url, api_key_env, headers, requests_per_minute,
                max_in_flight, timeout_ms, budget_key, limits, reserve_percent, auth,
                rate_signals, erase
         FROM connections WHERE name = $1",
        name
    )
    .fetch_optional(db)
    .await?;
    Ok(row.map(|r| NewConnection {
        name: r.name,
        writer: r.writer,
        base_url: r.base_url,
        api_key_env: r.api_key_env,
        auth: r.auth,
        headers: r.headers.as_object().cloned().unwrap_or_default(),
        requests_per_minute: r.requests_per_minute,
        max_in_flight: Some(r.max_in_flight),
        timeout_ms: Some(r.timeout_ms),
        budget_key: r.budget_key,
        limits: r.limits.iter().filter_map(|l| l.parse().ok()).collect(),
        reserve: (r.reserve_percent > 0).then(|| format!("{}%", r.reserve_percent)),
        rate_signals: r.rate_signals,
        erase: r.erase,
    }))
}

/// The rule named `name` as it would be given to save it again, if there is one.
pub async fn given_rule(db: &mut PgConnection, name: &str) -> Result<Option<NewRule>, sqlx::Error> {
    let row = sqlx::query!(
        "SELECT r.name, c.name AS connection, r.path, r.batch_size, r.max_attempts,
                r.backoff_base_ms, r.backoff_max_ms, r.enabled, r.weight, r.records_per_call,
                r.budget_key, r.answer, r.request, r.limits, r.job, r.identities
         FROM rules r JOIN connections c ON c.id = r.connection_id WHERE r.name = $1",
        name
    )
    .fetch_optional(db)
    .await?;
    Ok(row.map(|r| NewRule {
        name: r.name,
        connection: r.connection,
        path: r.path,
        batch_size: Some(r.batch_size),
        max_attempts: Some(r.max_attempts),
        backoff_base_ms: Some(r.backoff_base_ms),
        backoff_max_ms: Some(r.backoff_max_ms),
        enabled: Some(r.enabled),
        weight: Some(r.weight),
        records_per_call: Some(r.records_per_call),
        budget_key: r.budget_key,
        limits: r.limits.iter().filter_map(|l| l.parse().ok()).collect(),
        answer: r.answer,
        request: r.request,
        job: r.job,
        identities: r.identities,
    }))
}
