//! Connecting to PostgreSQL, creating courier's database when it does not exist yet, and
//! applying both schemas: courier's own (`migrations/`) and apalis' (schema `apalis`).

use std::str::FromStr;

use apalis_postgres::PostgresStorage;
use sqlx::{
    Connection, PgConnection, PgPool,
    postgres::{PgConnectOptions, PgPoolOptions},
};

use crate::config::redact_url;

/// Failure to reach or prepare the database.
#[derive(Debug, thiserror::Error)]
pub enum DbError {
    /// The URL could not be parsed.
    #[error("DATABASE_URL {url} is not a valid PostgreSQL URL: {source}")]
    BadUrl {
        /// The URL with any password masked.
        url: String,
        /// What the parser said.
        source: sqlx::Error,
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

/// Opens a pool on `url`, creating the database first if the server has no such database.
pub async fn connect(url: &str, max_connections: u32) -> Result<PgPool, DbError> {
    let options = PgConnectOptions::from_str(url).map_err(|source| DbError::BadUrl {
        url: redact_url(url),
        source,
    })?;
    ensure_database(&options)
        .await
        .map_err(|source| DbError::Sql {
            url: redact_url(url),
            source,
        })?;
    PgPoolOptions::new()
        .max_connections(max_connections)
        .connect_with(options)
        .await
        .map_err(|source| DbError::Sql {
            url: redact_url(url),
            source,
        })
}

/// Creates the database named in `options` when it is missing (connecting through the
/// server's `postgres` database to do so).
async fn ensure_database(options: &PgConnectOptions) -> Result<(), sqlx::Error> {
    let Some(name) = options.get_database().map(str::to_owned) else {
        return Ok(());
    };
    let mut admin = PgConnection::connect_with(&options.clone().database("postgres")).await?;
    let exists: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)")
            .bind(&name)
            .fetch_one(&mut admin)
            .await?;
    if !exists {
        let sql = format!("CREATE DATABASE \"{}\"", name.replace('"', "\"\""));
        // Two processes may race to create it; the loser sees "already exists".
        if let Err(e) = sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
            .execute(&mut admin)
            .await
        {
            let duplicate = e
                .as_database_error()
                .and_then(|d| d.code())
                .is_some_and(|c| c == "42P04");
            if !duplicate {
                return Err(e);
            }
        }
        tracing::info!(database = %name, "created database");
    }
    admin.close().await
}

/// Applies apalis' migrations (schema `apalis`) and then courier's.
pub async fn migrate(pool: &PgPool) -> Result<(), DbError> {
    PostgresStorage::<()>::setup(pool)
        .await
        .map_err(|e| DbError::Migrate(format!("apalis: {e}")))?;
    sqlx::migrate!("./migrations")
        .run(pool)
        .await
        .map_err(|e| DbError::Migrate(format!("courier: {e}")))?;
    Ok(())
}
