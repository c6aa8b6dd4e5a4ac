//! What a connection must never let out: its API key, its Basic password, its OAuth
//! client secret and tokens (the one in force and those before it), and the values of its
//! secret headers. Every text a target sends back (error bodies, per-record messages, a
//! kept header value) passes one boundary, [`Secrets::seal`], on its way from the writer
//! to the call stage, before anything stores, logs or shows it: each secret in any form a
//! target is likely to echo becomes `***`, and a text longer than [`TEXT_LIMIT`] is cut,
//! the cut marked.

use std::{
    collections::VecDeque,
    sync::{Arc, RwLock},
};

use base64::Engine as _;

use super::wire::{WriteError, Written};

/// Header names whose values are secret, matched case-insensitively as substrings.
const SECRET_HEADER_HINTS: &[&str] = &[
    "authorization",
    "api-key",
    "apikey",
    "x-api-key",
    "token",
    "secret",
    "password",
    "cookie",
    "key",
];

/// The longest text from a target (or quoting a payload) that is kept, in bytes.
pub const TEXT_LIMIT: usize = 1024;

/// Tokens remembered after they were replaced: an answer in flight may still echo one.
const TOKENS_KEPT: usize = 4;

/// The secret strings of one connection, in every form a target is likely to echo. Cheap
/// to clone: the clones share one list, so a token fetched later is hidden everywhere.
#[derive(Clone, Debug, Default)]
pub struct Secrets(Arc<RwLock<Forms>>);

#[derive(Debug, Default)]
struct Forms {
    /// The forms of the connection's fixed secrets.
    fixed: Vec<String>,
    /// The forms of each token, newest last.
    tokens: VecDeque<Vec<String>>,
    /// Every form, longest first, so a value and a part of it are both covered.
    all: Vec<String>,
}

impl Forms {
    fn rebuild(&mut self) {
        let mut all: Vec<String> = self.fixed.clone();
        all.extend(self.tokens.iter().flatten().cloned());
        all.sort_by_key(|f| std::cmp::Reverse(f.len()));
        all.dedup();
        self.all = all;
    }
}

/// Whether a header named `name` carries a secret (`Authorization`, `X-Api-Key`, ...).
pub fn is_secret_header(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    SECRET_HEADER_HINTS.iter().any(|h| name.contains(h))
}

impl Secrets {
    /// Adds a secret value: a key, or a full header value such as `Bearer <key>`,
    /// `Klaviyo-API-Key <key>` or `Basic <base64 of user:password>`.
    pub fn add(&self, value: &str) {
        let mut forms = self.0.write().unwrap_or_else(|e| e.into_inner());
        for form in forms_of(value) {
            if !forms.fixed.contains(&form) {
                forms.fixed.push(form);
            }
        }
        forms.rebuild();
    }

    /// Adds an OAuth token; the oldest of more than [`TOKENS_KEPT`] is forgotten.
    pub fn add_token(&self, token: &str) {
        let new = forms_of(token);
        {
            let forms = self.0.read().unwrap_or_else(|e| e.into_inner());
            if forms.tokens.iter().any(|t| *t == new) {
                return;
            }
        }
        let mut forms = self.0.write().unwrap_or_else(|e| e.into_inner());
        forms.tokens.push_back(new);
        while forms.tokens.len() > TOKENS_KEPT {
            forms.tokens.pop_front();
        }
        forms.rebuild();
    }

    /// `text` with every secret replaced by `***`, and cut to [`TEXT_LIMIT`].
    pub fn redact(&self, text: &str) -> String {
        let forms = self.0.read().unwrap_or_else(|e| e.into_inner());
        let mut out = text.to_owned();
        for form in &forms.all {
            if out.contains(form.as_str()) {
                out = out.replace(form.as_str(), "***");
            }
        }
        drop(forms);
        cut(out)
    }

    /// A write error with every text the target sent redacted and bounded.
    pub fn seal_error(&self, e: WriteError) -> WriteError {
        match e {
            WriteError::RateLimited {
                wait,
                raw,
                rate_headers,
            } => WriteError::RateLimited {
                wait,
                raw: raw.map(|r| self.redact(&r)),
                rate_headers,
            },
            WriteError::Permanent { status, message } => WriteError::Permanent {
                status,
                message: self.redact(&message),
            },
            WriteError::Transient { status, message } => WriteError::Transient {
                status,
                message: self.redact(&message),
            },
            WriteError::Unaccounted { status, message } => WriteError::Unaccounted {
                status,
                message: self.redact(&message),
            },
        }
    }

    /// A call's answer, every record's error included, sealed: the one boundary between
    /// what a target said and what courier keeps.
    pub fn seal(&self, result: Result<Written, WriteError>) -> Result<Written, WriteError> {
        match result {
            Ok(mut written) => {
                for item in &mut written.items {
                    *item = item.take().map(|e| self.seal_error(e));
                }
                Ok(written)
            }
            Err(e) => Err(self.seal_error(e)),
        }
    }
}

/// Every form of a secret value worth hiding: the value, the credential after a scheme,
/// a Basic password, each percent-encoded (either case), form-encoded, JSON-escaped and
/// in base64. Parts shorter than 4 characters cannot be told from ordinary text and are
/// not hidden.
fn forms_of(value: &str) -> Vec<String> {
    let value = value.trim();
    let mut parts = vec![value.to_owned()];
    if let Some((_, credential)) = value.rsplit_once(' ') {
        parts.push(credential.trim().to_owned());
        if let Some(decoded) = value
            .strip_prefix("Basic ")
            .and_then(|b| {
                base64::engine::general_purpose::STANDARD
                    .decode(b.trim())
                    .ok()
            })
            .and_then(|d| String::from_utf8(d).ok())
        {
            if let Some((_, password)) = decoded.split_once(':') {
                parts.push(password.to_owned());
            }
            parts.push(decoded);
        }
    }
    let mut out = Vec::new();
    for part in parts.into_iter().filter(|p| p.chars().count() >= 4) {
        let encoded = percent_encode(&part);
        let json = serde_json::to_string(&part).expect("a string serializes");
        let json = json[1..json.len() - 1].to_owned();
        for form in [
            encoded.replace("%20", "+"),
            lower_hex(&encoded),
            encoded,
            json,
            base64::engine::general_purpose::STANDARD.encode(&part),
            part,
        ] {
            if !out.contains(&form) {
                out.push(form);
            }
        }
    }
    out
}

/// `text` cut to [`TEXT_LIMIT`] bytes (at a character's edge), the cut marked.
pub fn cut(text: String) -> String {
    if text.len() <= TEXT_LIMIT {
        return text;
    }
    let mut end = TEXT_LIMIT;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… [cut: {} more bytes]", &text[..end], text.len() - end)
}

/// RFC 3986 percent-encoding of everything but unreserved characters.
fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A percent-encoded text with lowercase hex digits (`%2f`), as some servers echo it.
fn lower_hex(encoded: &str) -> String {
    let mut out = String::with_capacity(encoded.len());
    let mut digits = 0u8;
    for c in encoded.chars() {
        out.push(if digits > 0 {
            c.to_ascii_lowercase()
        } else {
            c
        });
        digits = if c == '%' {
            2
        } else {
            digits.saturating_sub(1)
        };
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_likely_echo_of_a_key_is_hidden() {
        let s = Secrets::default();
        s.add("Bearer SECRET123/+=");
        let echoes = [
            "invalid token Bearer SECRET123/+=",
            "invalid token SECRET123/+=",
            "key=SECRET123%2F%2B%3D rejected",
            "key=SECRET123%2f%2b%3d rejected",
            "b64 U0VDUkVUMTIzLys9",
        ];
        for echo in echoes {
            let redacted = s.redact(echo);
            assert!(!redacted.contains("SECRET123"), "{redacted}");
            assert!(!redacted.contains("U0VDUkVUMTIz"), "{redacted}");
            assert!(redacted.contains("***"), "{redacted}");
        }
        assert_eq!(s.redact("nothing here"), "nothing here");
    }

    #[test]
    fn a_basic_password_and_a_key_after_any_scheme_are_hidden() {
        let s = Secrets::default();
        // base64("anystring:pa55word")
        s.add("Basic YW55c3RyaW5nOnBhNTV3b3Jk");
        s.add("Klaviyo-API-Key pk_live_123");
        let r = s.redact("user anystring, password pa55word; key pk_live_123");
        assert!(!r.contains("pa55word") && !r.contains("pk_live_123"), "{r}");
    }

    #[test]
    fn tokens_are_hidden_until_long_replaced() {
        let s = Secrets::default();
        for t in ["tok-one", "tok-two", "tok-three", "tok-four", "tok-five"] {
            s.add_token(t);
        }
        assert_eq!(s.redact("tok-two tok-five"), "*** ***");
        assert_eq!(s.redact("tok-one"), "tok-one");
    }

    #[test]
    fn long_texts_are_cut_with_the_cut_marked() {
        let s = Secrets::default();
        let long = "é".repeat(TEXT_LIMIT);
        let r = s.redact(&long);
        assert!(r.len() < TEXT_LIMIT + 40, "{}", r.len());
        assert!(
            r.ends_with(&format!("[cut: {} more bytes]", TEXT_LIMIT)),
            "{r}"
        );
    }

    #[test]
    fn secret_headers_are_recognised_by_name() {
        assert!(is_secret_header("Authorization"));
        assert!(is_secret_header("X-Api-Key"));
        assert!(is_secret_header("X-Auth-Token"));
        assert!(!is_secret_header("Accept"));
        assert!(!is_secret_header("X-Request-Source"));
    }
}
