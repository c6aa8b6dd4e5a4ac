//! What a connection must never let out: its API key and the values of its secret headers.
//! Every error text a target sends back passes through [`Secrets::redact`] before it is
//! stored (ledger, deliveries, circuits, blocks) or shown, so a target that echoes the key
//! (`{"detail": "invalid token Bearer SECRET123"}`) leaves `***` behind instead.

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

/// Schemes an authorization value may start with; the credential after them is secret too.
const SCHEMES: &[&str] = &["Bearer ", "Token ", "Basic ", "Bearer", "Token"];

/// The secret strings of one connection, in every form a target is likely to echo.
#[derive(Clone, Debug, Default)]
pub struct Secrets {
    /// Longest first, so a value and a part of it are both covered.
    forms: Vec<String>,
}

/// Whether a header named `name` carries a secret (`Authorization`, `X-Api-Key`, ...).
pub fn is_secret_header(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    SECRET_HEADER_HINTS.iter().any(|h| name.contains(h))
}

impl Secrets {
    /// Adds a secret value (a key, or a full header value such as `Bearer <key>`).
    pub fn add(&mut self, value: &str) {
        let value = value.trim();
        let mut parts = vec![value.to_owned()];
        for scheme in SCHEMES {
            if let Some(rest) = value.strip_prefix(scheme) {
                parts.push(rest.trim().to_owned());
            }
        }
        for part in parts {
            // Too short to tell from ordinary text; such a key is not worth hiding badly.
            if part.chars().count() < 4 {
                continue;
            }
            let encoded = percent_encode(&part);
            let form_encoded = encoded.replace("%20", "+");
            for form in [part, encoded, form_encoded] {
                if !self.forms.contains(&form) {
                    self.forms.push(form);
                }
            }
        }
        self.forms.sort_by_key(|f| std::cmp::Reverse(f.len()));
    }

    /// `text` with every secret replaced by `***`.
    pub fn redact(&self, text: &str) -> String {
        let mut out = text.to_owned();
        for form in &self.forms {
            if out.contains(form.as_str()) {
                out = out.replace(form.as_str(), "***");
            }
        }
        out
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_likely_echo_of_a_key_is_hidden() {
        let mut s = Secrets::default();
        s.add("Bearer SECRET123/+=");
        let echoes = [
            "invalid token Bearer SECRET123/+=",
            "invalid token SECRET123/+=",
            "key=SECRET123%2F%2B%3D rejected",
        ];
        for echo in echoes {
            let redacted = s.redact(echo);
            assert!(!redacted.contains("SECRET123"), "{redacted}");
            assert!(redacted.contains("***"), "{redacted}");
        }
        assert_eq!(s.redact("nothing here"), "nothing here");
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
