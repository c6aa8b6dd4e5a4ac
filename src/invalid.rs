//! Why something a user stated cannot be used ([`Invalid`]: the field, and what is wrong
//! with it), and why an answer of a target cannot be read as a rule says it reads
//! ([`Unread`]). The lowest layer: any module may name these, and they name nothing.

/// Why a stated value cannot be used: the field at fault and what is wrong with it, in
/// words that name the field and never a secret. Shown as the reason alone, which names
/// the field within it (`job: poll.path must name the job's {id}`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{reason}")]
pub struct Invalid {
    /// The field at fault, as a rule or connection names it (`writer`, `path`,
    /// `records_per_call`, `request`, `answer`, `job`, `auth`, `base_url`, `headers`,
    /// `rate_signals`, `preset`, or a delivery's `record_key`, `payload`, ...).
    pub field: &'static str,
    /// What is wrong.
    pub reason: String,
}

impl Invalid {
    /// `reason` about `field`.
    pub fn new(field: &'static str, reason: impl Into<String>) -> Self {
        Self {
            field,
            reason: reason.into(),
        }
    }

    /// For `map_err`: a reason about `field`.
    pub fn at(field: &'static str) -> impl FnOnce(String) -> Self {
        move |reason| Self { field, reason }
    }
}

/// Why an answer of the target cannot be read as the rule says it reads: what was
/// looked for and what was found instead.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Unread(pub String);

impl From<String> for Unread {
    fn from(why: String) -> Self {
        Self(why)
    }
}

impl From<&str> for Unread {
    fn from(why: &str) -> Self {
        Self(why.to_owned())
    }
}
