//! Erasure: a person forgotten in every target and in courier itself (GDPR art. 17 and
//! 19).
//!
//! - **Asked** from SQL (`SELECT courier_erase('{"email": ...}'::jsonb)`), the CLI
//!   (`courier erase`) or [`request`]: one function in the database checks the identities
//!   (e-mail, phone, the shop's external id, record keys), opens the erasure and a row per
//!   connection, and returns its id ([`store`]).
//! - **Nothing more goes out for the person** from then on: every claim of a run passes the
//!   [`gate`], which suppresses (and empties) each delivery naming one of their identities
//!   (where the rule's `identities` say they sit, or by record key) before any call; the
//!   worker marks the person's deliveries and suppresses those pending ([`store::sweep`]).
//! - **Each target told** ([`eraser`]): per connection, once nothing that may still carry
//!   the person there is in flight (a run that began before the erasure, a target job
//!   holding one of their records), the connection's erase operation
//!   ([`crate::writer::erase`]) is one paced call like any other; its answer is recorded
//!   per connection (`erased`, `unknown`, `queued`, `no_operation`, `no_identity`,
//!   `failed`).
//! - **courier's own copies purged** once every target has answered ([`store::close`]):
//!   the person's deliveries (and their ledger rows) and delivered records are deleted,
//!   their values scrubbed from stored texts, their identities in clear forgotten. What
//!   stays is the audit (`erasures`, `erasure_targets`) and the person's keyed hashes
//!   (HMAC-SHA-256 under [`ErasureKey`], `COURIER_ERASURE_KEY`, never stored), by which
//!   the gate keeps suppressing them until an operator lifts it ([`lift`]).

pub mod eraser;
pub mod gate;
pub mod store;

use hmac::{KeyInit, Mac};
use serde::Serialize;
use sqlx::PgPool;

/// The secret an erased person's identities are hashed under: the same for every process,
/// never stored, never printed (its `Debug` says `ErasureKey(..)`).
#[derive(Clone)]
pub struct ErasureKey(Vec<u8>);

/// The shortest key accepted, in bytes.
pub const MIN_KEY_LEN: usize = 32;

impl ErasureKey {
    /// `key`, at least [`MIN_KEY_LEN`] bytes; the error says why not (never the key).
    pub fn new(key: &str) -> Result<Self, String> {
        if key.len() < MIN_KEY_LEN {
            return Err(format!(
                "the erasure key is {} characters; it takes at least {MIN_KEY_LEN} (e.g. \
                 `openssl rand -hex 32`), the same in every process",
                key.len()
            ));
        }
        Ok(Self(key.as_bytes().to_vec()))
    }

    /// The keyed hash of an identity as courier compares it (`kind:value`, the value as
    /// the database normalizes it: `courier_identity`), in hex.
    pub fn hash(&self, identity: &str) -> String {
        let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(&self.0).expect("any key length");
        mac.update(identity.as_bytes());
        let bytes = mac.finalize().into_bytes();
        let mut hex = String::with_capacity(64);
        for b in bytes {
            use std::fmt::Write;
            let _ = write!(hex, "{b:02x}");
        }
        hex
    }
}

impl std::fmt::Debug for ErasureKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ErasureKey(..)")
    }
}

/// A person to forget, by every identity they may be known by.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Person {
    /// Their e-mail address.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub email: Option<String>,
    /// Their phone number.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub phone: Option<String>,
    /// The shop's id of them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub external_id: Option<String>,
    /// Record keys of their records (`customer:123`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub keys: Vec<String>,
}

/// Why an erasure (or a lift) was refused.
#[derive(Debug, thiserror::Error)]
pub enum EraseError {
    /// The identities given cannot be used: the database's words, naming the field.
    #[error("{0}")]
    Invalid(String),
    /// No erasure of that person to lift.
    #[error("{0}")]
    NotFound(String),
    /// The database refused otherwise.
    #[error(transparent)]
    Sql(sqlx::Error),
}

impl From<sqlx::Error> for EraseError {
    fn from(e: sqlx::Error) -> Self {
        // courier_erase refuses bad input with SQLSTATE 22023 and a message naming the field.
        match e.as_database_error() {
            Some(d) if d.code().as_deref() == Some("22023") => {
                EraseError::Invalid(d.message().trim_start_matches("courier_erase: ").to_owned())
            }
            _ => EraseError::Sql(e),
        }
    }
}

/// Opens an erasure of `person` (or finds the open one of the same identities): its id.
pub async fn request(pool: &PgPool, person: &Person, asked_by: &str) -> Result<i64, EraseError> {
    let person = serde_json::to_value(person).expect("a person serializes");
    Ok(
        sqlx::query_scalar!(r#"SELECT courier_erase($1, $2) AS "id!""#, person, asked_by)
            .fetch_one(pool)
            .await?,
    )
}

/// Lifts the suppression of `person` (they consented again), recorded on each erasure of
/// them by `by`: deliveries naming them go out again from now on. Needs the key their
/// identities were hashed under; returns the erasures lifted.
pub async fn lift(
    pool: &PgPool,
    key: &ErasureKey,
    person: &Person,
    by: &str,
) -> Result<Vec<i64>, EraseError> {
    let person = serde_json::to_value(person).expect("a person serializes");
    // The identities as the database normalizes them, then hashed here.
    let identities: Vec<String> = sqlx::query_scalar!(
        r#"SELECT i.kind || ':' || courier_identity(i.kind, i.value) AS "identity!"
           FROM courier_person_identities($1) i"#,
        person
    )
    .fetch_all(pool)
    .await?;
    let hashes: Vec<String> = identities.iter().map(|i| key.hash(i)).collect();
    let mut tx = pool.begin().await?;
    let open: Vec<i64> = sqlx::query_scalar!(
        "SELECT DISTINCT e.id FROM erased_identities h JOIN erasures e ON e.id = h.erasure_id
         WHERE h.hash = ANY($1) AND e.status = 'open'",
        &hashes
    )
    .fetch_all(&mut *tx)
    .await?;
    if !open.is_empty() {
        return Err(EraseError::Invalid(format!(
            "erasure {open:?} of this person is still open: it is lifted once every target \
             has answered"
        )));
    }
    let lifted: Vec<i64> = sqlx::query_scalar!(
        r#"WITH gone AS (DELETE FROM erased_identities WHERE hash = ANY($1) RETURNING erasure_id)
           UPDATE erasures e SET lifted_at = now(), lifted_by = $2
           WHERE e.id IN (SELECT erasure_id FROM gone) RETURNING e.id"#,
        &hashes,
        by
    )
    .fetch_all(&mut *tx)
    .await?;
    tx.commit().await?;
    if lifted.is_empty() {
        return Err(EraseError::NotFound(
            "no erasure of this person is in force (or it was hashed under another key)".into(),
        ));
    }
    Ok(lifted)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_keyed_hash_is_hmac_sha256_and_the_key_never_prints() {
        // RFC 4231, test case 2 (a key shorter than courier accepts, built here directly).
        let key = ErasureKey(b"Jefe".to_vec());
        assert_eq!(
            key.hash("what do ya want for nothing?"),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        let long = ErasureKey::new(&"Jefe".repeat(8)).unwrap();
        assert_ne!(long.hash("email:a@b.c"), key.hash("email:a@b.c"));
        assert_eq!(format!("{long:?}"), "ErasureKey(..)");
        assert!(
            ErasureKey::new("short")
                .unwrap_err()
                .contains("at least 32")
        );
    }
}
