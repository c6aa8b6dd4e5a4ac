//! The subcommands of the `courier` binary, one module each: what a command takes (its
//! `clap` arguments) and what it does with it. `main.rs` parses and dispatches.

pub mod catalog;
pub mod deliveries;
pub mod erase;
pub mod target;
pub mod worker;

use courier::{config::Settings, db};

/// What every command may need: the settings, and the database they name.
pub struct Ctx {
    /// The validated settings.
    pub settings: Settings,
}

impl Ctx {
    /// A pool on `DATABASE_URL`, as it is.
    pub async fn connect(&self) -> Result<sqlx::PgPool, db::DbError> {
        db::connect_with(&self.settings.database_url, &self.settings.pool()).await
    }

    /// A pool on `DATABASE_URL` whose migrations are all applied: commands that read or
    /// write courier's tables need them, and say so in one line otherwise.
    pub async fn pool(&self) -> Result<sqlx::PgPool, db::DbError> {
        let pool = self.connect().await?;
        db::ensure_migrated(&pool).await?;
        Ok(pool)
    }
}
