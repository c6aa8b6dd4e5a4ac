//! Connecting to PostgreSQL, creating courier's database (only when asked: `courier db
//! create`, the demo, the benchmarks), and applying both schemas: courier's own
//! (`migrations/`) and apalis' (schema `apalis`).

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

/// Opens a pool on the database `url` names. It connects nowhere else and never creates
/// the database (production roles often may not): [`create_database`] does that, called
/// only by `courier db create`, the demo and the benchmarks.
pub async fn connect(url: &str, max_connections: u32) -> Result<PgPool, DbError> {
    let options = parse(url)?;
    let name = options.get_database().map(str::to_owned);
    PgPoolOptions::new()
        .max_connections(max_connections)
        .connect_with(options)
        .await
        .map_err(|source| match name {
            Some(name) if is_code(&source, "3D000") => DbError::Missing {
                url: redact_url(url),
                name,
            },
            _ => DbError::Sql {
                url: redact_url(url),
                source,
            },
        })
}

/// Creates the database `url` names when the server has none by that name, connecting
/// through the server's `postgres` database to do so (the role needs CREATEDB). Returns
/// whether it created it; a database that exists already is left alone.
pub async fn create_database(url: &str) -> Result<bool, DbError> {
    let options = parse(url)?;
    let Some(name) = options.get_database().map(str::to_owned) else {
        return Ok(false);
    };
    ensure_database(&options, &name)
        .await
        .map_err(|source| DbError::Sql {
            url: redact_url(url),
            source,
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

async fn ensure_database(options: &PgConnectOptions, name: &str) -> Result<bool, sqlx::Error> {
    let mut admin = PgConnection::connect_with(&options.clone().database("postgres")).await?;
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
    Ok(created)
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
