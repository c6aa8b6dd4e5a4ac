//! Connecting to PostgreSQL, creating courier's database (only when asked: `courier db
//! create`, the demo, the benchmarks), and applying both schemas: courier's own
//! (`migrations/`) and apalis' (schema `apalis`).

use std::{str::FromStr, time::Duration};

use apalis_postgres::PostgresStorage;
use sqlx::{
    Connection, PgConnection, PgPool,
    postgres::{PgConnectOptions, PgPoolOptions},
};

/// Connections in the worker's database pool.
pub const DEFAULT_DB_MAX_CONNECTIONS: u32 = 10;
/// Default `COURIER_DB_CONNECT_TIMEOUT_SECONDS`: a connect to the database that has not
/// completed by then fails, naming host and port.
pub const DEFAULT_DB_CONNECT_TIMEOUT_SECS: u64 = 10;
/// Default `COURIER_DB_STATEMENT_TIMEOUT_SECONDS`: PostgreSQL cancels any statement of
/// courier's that runs longer (migrations excepted).
pub const DEFAULT_DB_STATEMENT_TIMEOUT_SECS: u64 = 60;

/// The longest a statement waits for a free connection of the pool (or for a new one to
/// open) once the pool is up.
pub const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(30);

/// How a pool is set up: its size and how long anything may wait on the database.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolSettings {
    /// Connections in the pool.
    pub max_connections: u32,
    /// The longest connecting may take: a server that accepts the TCP connection but never
    /// answers like PostgreSQL fails the connect after this, naming host and port.
    pub connect_timeout: Duration,
    /// `statement_timeout` of every connection: PostgreSQL cancels a statement running
    /// longer (waiting for a lock included). Migrations run without it.
    pub statement_timeout: Duration,
}

impl Default for PoolSettings {
    fn default() -> Self {
        Self {
            max_connections: DEFAULT_DB_MAX_CONNECTIONS,
            connect_timeout: Duration::from_secs(DEFAULT_DB_CONNECT_TIMEOUT_SECS),
            statement_timeout: Duration::from_secs(DEFAULT_DB_STATEMENT_TIMEOUT_SECS),
        }
    }
}

/// Failure to reach or prepare the database.
#[derive(Debug, thiserror::Error)]
pub enum DbError {
    /// courier's migrations have not all been applied to this database.
    #[error(
        "the database is not migrated ({pending} of {total} courier migrations not applied): \
         run `courier migrate` first"
    )]
    NotMigrated {
        /// Migrations not applied yet.
        pending: usize,
        /// Migrations this build knows.
        total: usize,
    },
    /// The URL could not be parsed.
    #[error("DATABASE_URL {url} is not a valid PostgreSQL URL: {source}")]
    BadUrl {
        /// The URL with any password masked.
        url: String,
        /// What the parser said.
        source: sqlx::Error,
    },
    /// The server has no database by that name.
    #[error(
        "database {name:?} does not exist on {url}: create it once with `courier db create` \
         (the role needs CREATEDB) or with CREATE DATABASE"
    )]
    Missing {
        /// The URL with any password masked.
        url: String,
        /// The database's name.
        name: String,
    },
    /// Connecting did not complete in time: nothing that speaks PostgreSQL answered.
    #[error(
        "database {url}: no answer from {address} within {} s (is a PostgreSQL server \
         listening there? COURIER_DB_CONNECT_TIMEOUT_SECONDS sets the limit)",
        .after.as_secs_f64()
    )]
    ConnectTimeout {
        /// The URL with any password masked.
        url: String,
        /// `host:port`, or the Unix socket's path.
        address: String,
        /// How long it waited.
        after: Duration,
    },
    /// Connecting or querying failed.
    #[error("database {url}: {source}")]
    Sql {
        /// The URL with any password masked.
        url: String,
        /// The driver's error.
        source: sqlx::Error,
    },
    /// A migration failed.
    #[error("applying migrations: {0}")]
    Migrate(String),
}

/// Opens a pool on the database `url` names, with `max_connections` connections and the
/// default timeouts ([`PoolSettings::default`]); see [`connect_with`].
pub async fn connect(url: &str, max_connections: u32) -> Result<PgPool, DbError> {
    connect_with(
        url,
        &PoolSettings {
            max_connections,
            ..PoolSettings::default()
        },
    )
    .await
}

/// Opens a pool on the database `url` names. It connects nowhere else and never creates
/// the database (production roles often may not): [`create_database`] does that, called
/// only by `courier db create`, the demo and the benchmarks. Nothing here waits forever:
/// the first connection must be made within `settings.connect_timeout` (the error names
/// host and port, never the password), later ones within [`ACQUIRE_TIMEOUT`], and every
/// statement on the pool's connections within `settings.statement_timeout`.
pub async fn connect_with(url: &str, settings: &PoolSettings) -> Result<PgPool, DbError> {
    let options = parse(url)?;
    let name = options.get_database().map(str::to_owned);
    let statement_timeout = format!("{}ms", settings.statement_timeout.as_millis().max(1));
    let pool = PgPoolOptions::new()
        .max_connections(settings.max_connections)
        .acquire_timeout(ACQUIRE_TIMEOUT.max(settings.connect_timeout))
        .after_connect(move |conn, _| {
            let statement_timeout = statement_timeout.clone();
            Box::pin(async move {
                sqlx::query("SELECT set_config('statement_timeout', $1, false)")
                    .bind(statement_timeout)
                    .execute(conn)
                    .await?;
                Ok(())
            })
        })
        .connect_with(options.clone());
    match tokio::time::timeout(settings.connect_timeout, pool).await {
        Ok(Ok(pool)) => Ok(pool),
        Ok(Err(sqlx::Error::PoolTimedOut)) | Err(_) => Err(DbError::ConnectTimeout {
            url: redact_url(url),
            address: address(&options),
            after: settings.connect_timeout,
        }),
        Ok(Err(source)) => Err(match name {
            Some(name) if is_code(&source, "3D000") => DbError::Missing {
                url: redact_url(url),
                name,
            },
            _ => DbError::Sql {
                url: redact_url(url),
                source,
            },
        }),
    }
}

/// Where `options` connect to: `host:port`, or the Unix socket's path.
fn address(options: &PgConnectOptions) -> String {
    match options.get_socket() {
        Some(socket) => socket.display().to_string(),
        None => format!("{}:{}", options.get_host(), options.get_port()),
    }
}

/// Creates the database `url` names when the server has none by that name, connecting
/// through the server's `postgres` database to do so (the role needs CREATEDB). Returns
/// whether it created it; a database that exists already is left alone. Connecting is
/// bounded as in [`connect`], by the default connect timeout.
pub async fn create_database(url: &str) -> Result<bool, DbError> {
    create_database_within(url, Duration::from_secs(DEFAULT_DB_CONNECT_TIMEOUT_SECS)).await
}

/// [`create_database`], with the connect bounded by `connect_timeout`.
pub async fn create_database_within(url: &str, connect_timeout: Duration) -> Result<bool, DbError> {
    let options = parse(url)?;
    let Some(name) = options.get_database().map(str::to_owned) else {
        return Ok(false);
    };
    ensure_database(&options, &name, connect_timeout)
        .await
        .map_err(|source| DbError::Sql {
            url: redact_url(url),
            source,
        })?
        .ok_or_else(|| DbError::ConnectTimeout {
            url: redact_url(url),
            address: address(&options),
            after: connect_timeout,
        })
}

fn parse(url: &str) -> Result<PgConnectOptions, DbError> {
    PgConnectOptions::from_str(url).map_err(|source| DbError::BadUrl {
        url: redact_url(url),
        source,
    })
}

/// Whether `e` is a database error with SQLSTATE `code`.
fn is_code(e: &sqlx::Error, code: &str) -> bool {
    e.as_database_error()
        .and_then(|d| d.code())
        .is_some_and(|c| c == code)
}

/// `None` when connecting took longer than `connect_timeout`.
async fn ensure_database(
    options: &PgConnectOptions,
    name: &str,
    connect_timeout: Duration,
) -> Result<Option<bool>, sqlx::Error> {
    let admin = options.clone().database("postgres");
    let Ok(admin) = tokio::time::timeout(connect_timeout, PgConnection::connect_with(&admin)).await
    else {
        return Ok(None);
    };
    let mut admin = admin?;
    let exists: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)")
            .bind(name)
            .fetch_one(&mut admin)
            .await?;
    let mut created = false;
    if !exists {
        let sql = format!("CREATE DATABASE \"{}\"", name.replace('"', "\"\""));
        // Two processes may race to create it; the loser sees "already exists".
        match sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
            .execute(&mut admin)
            .await
        {
            Ok(_) => {
                created = true;
                tracing::info!(database = %name, "created database");
            }
            Err(e) if is_code(&e, "42P04") => {}
            Err(e) => return Err(e),
        }
    }
    admin.close().await?;
    Ok(Some(created))
}

/// Fails with [`DbError::NotMigrated`] unless every migration this build knows has been
/// applied (a command that reads or writes courier's tables checks this first, instead of
/// failing on a missing table).
pub async fn ensure_migrated(pool: &PgPool) -> Result<(), DbError> {
    let known: Vec<i64> = sqlx::migrate!("./migrations")
        .iter()
        .map(|m| m.version)
        .collect();
    let applied: Vec<i64> = sqlx::query_scalar(
        "SELECT version FROM _sqlx_migrations WHERE success
         AND to_regclass('public._sqlx_migrations') IS NOT NULL",
    )
    .fetch_all(pool)
    .await
    .or_else(|e| {
        if is_code(&e, "42P01") {
            Ok(Vec::new())
        } else {
            Err(e)
        }
    })
    .map_err(|e| DbError::Migrate(format!("reading the applied migrations: {e}")))?;
    let pending = known.iter().filter(|v| !applied.contains(v)).count();
    if pending == 0 {
        Ok(())
    } else {
        Err(DbError::NotMigrated {
            pending,
            total: known.len(),
        })
    }
}

/// Applies apalis' migrations (schema `apalis`) and then courier's. Courier's run on a
/// connection taken out of the pool without the statement timeout (an index built on a
/// large table may take longer), which is closed afterwards.
pub async fn migrate(pool: &PgPool) -> Result<(), DbError> {
    migrate_before(pool, i64::MAX).await
}

/// As [`migrate`], with courier's migrations before `version` only: the schema an older
/// courier left, for a test of what the later migrations make of its rows.
pub async fn migrate_before(pool: &PgPool, version: i64) -> Result<(), DbError> {
    PostgresStorage::<()>::setup(pool)
        .await
        .map_err(|e| DbError::Migrate(format!("apalis: {e}")))?;
    let courier = |e: sqlx::Error| DbError::Migrate(format!("courier: {e}"));
    let mut conn = pool.acquire().await.map_err(courier)?.detach();
    sqlx::query("SELECT set_config('statement_timeout', '0', false)")
        .execute(&mut conn)
        .await
        .map_err(courier)?;
    let mut migrator = sqlx::migrate!("./migrations");
    if version < i64::MAX {
        let older: Vec<_> = migrator
            .migrations
            .iter()
            .filter(|m| m.version < version)
            .cloned()
            .collect();
        migrator.migrations = older.into();
    }
    let migrated = migrator.run(&mut conn).await;
    let _ = conn.close().await;
    migrated.map_err(|e| DbError::Migrate(format!("courier: {e}")))
}

/// `postgres://user:secret@host/db` → `postgres://user:***@host/db`.
pub fn redact_url(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let userinfo = &url[scheme + 3..at];
            match userinfo.find(':') {
                Some(colon) => format!(
                    "{}{}:***{}",
                    &url[..scheme + 3],
                    &userinfo[..colon],
                    &url[at..]
                ),
                None => url.to_owned(),
            }
        }
        _ => url.to_owned(),
    }
}
