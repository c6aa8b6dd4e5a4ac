//! How a connection's key is presented (its `auth`): the key itself is read from the
//! variable `api_key_env` names, never stored, and marked sensitive wherever it goes.

use crate::invalid::Invalid;
use reqwest::header::{AUTHORIZATION, HeaderName};
use serde::{Deserialize, Serialize};

/// How the key goes with each request.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Auth {
    /// `Authorization: Bearer <key>` (the default).
    #[default]
    Bearer,
    /// `<name>: <scheme> <key>`, or `<name>: <key>` without a scheme: Klaviyo's
    /// `Authorization: Klaviyo-API-Key <key>`, Brevo's `api-key: <key>`.
    Header {
        /// The header's name.
        name: String,
        /// The word before the key, if any.
        #[serde(default)]
        scheme: Option<String>,
    },
    /// HTTP Basic with the key as the password: Mailchimp's `anystring:<key>`, Customer.io's
    /// `<site id>:<key>`. The user is `user`, or read from the variable `user_env` names.
    Basic {
        /// The user name, as it is.
        #[serde(default)]
        user: Option<String>,
        /// The variable holding the user name (a site id).
        #[serde(default)]
        user_env: Option<String>,
    },
    /// OAuth 2 client credentials ([`super::oauth`]): a token from `token_url`, the
    /// client id read from `client_id_env` and the key as the client secret, sent as a
    /// bearer token; with `instance_url`, the token answer's instance URL is the base URL's
    /// origin (Salesforce).
    Oauth {
        /// The token endpoint.
        token_url: String,
        /// The variable holding the client id.
        client_id_env: String,
        /// The scope to ask for, if any.
        #[serde(default)]
        scope: Option<String>,
        /// Whether the token answer's `instance_url` replaces the base URL's origin.
        #[serde(default)]
        instance_url: bool,
        /// The hosts an instance URL may name (`.example.com`: it and its subdomains);
        /// absent: the token URL's host and the subdomains of its parent domain.
        #[serde(default)]
        instance_hosts: Vec<String>,
    },
}

impl Auth {
    /// Reads a connection's `auth` (JSON; `None`: bearer); the error names what is wrong.
    pub fn parse(value: Option<&serde_json::Value>) -> Result<Self, Invalid> {
        Self::parse_or_why(value).map_err(Invalid::at("auth"))
    }

    fn parse_or_why(value: Option<&serde_json::Value>) -> Result<Self, String> {
        let Some(value) = value else {
            return Ok(Auth::Bearer);
        };
        let auth: Auth = serde_json::from_value(value.clone())
            .map_err(|e| format!("auth: {e} (kinds: bearer, header, basic, oauth)"))?;
        // serde lets a unit variant of an internally tagged enum carry any field: refuse
        // them here, as the other kinds' unknown fields are.
        if auth == Auth::Bearer
            && let Some(field) = value
                .as_object()
                .into_iter()
                .flatten()
                .find_map(|(k, _)| (k != "kind").then_some(k))
        {
            return Err(format!(
                "auth: unknown field `{field}`: kind bearer takes no other field"
            ));
        }
        match &auth {
            Auth::Header { name, .. } if HeaderName::try_from(name.as_str()).is_err() => Err(
                format!("auth: header name {name:?} is not a valid HTTP header name"),
            ),
            Auth::Header { name, .. } if owned_header(name).is_some() => {
                let (owned, why) = owned_header(name).unwrap_or_default();
                Err(format!(
                    "auth: header name {owned} cannot carry the key: {why}"
                ))
            }
            Auth::Header {
                scheme: Some(scheme),
                ..
            } => check_scheme(scheme).map(|()| auth.clone()),
            Auth::Basic { user, user_env } if user.is_some() == user_env.is_some() => {
                Err("auth: basic takes one of user and user_env".into())
            }
            // Not echoed: a user may be a site id or worse.
            Auth::Basic { user: Some(u), .. } if u.contains(':') => Err(
                "auth: user holds a colon, where HTTP Basic ends the user and starts the key"
                    .into(),
            ),
            Auth::Basic {
                user_env: Some(var),
                ..
            } if !crate::model::is_variable_name(var) => Err(not_a_variable("user_env")),
            Auth::Oauth { token_url, .. } if check_base_url(token_url).is_err() => Err(format!(
                "auth: token_url {token_url:?} is not an absolute http(s) URL"
            )),
            Auth::Oauth { client_id_env, .. } if !crate::model::is_variable_name(client_id_env) => {
                Err(not_a_variable("client_id_env"))
            }
            _ => Ok(auth),
        }
    }

    /// The header carrying `key`: its name and value (`None` for OAuth, whose token is
    /// fetched per call). Basic reads its user from the environment when told to; the
    /// error names the variable, never a value.
    pub fn header(&self, key: &str) -> Result<Option<(HeaderName, String)>, Invalid> {
        self.header_or_why(key).map_err(Invalid::at("auth"))
    }

    fn header_or_why(&self, key: &str) -> Result<Option<(HeaderName, String)>, String> {
        use base64::Engine as _;
        Ok(Some(match self {
            Auth::Oauth { .. } => return Ok(None),
            Auth::Bearer => (AUTHORIZATION, format!("Bearer {key}")),
            Auth::Header { name, scheme } => {
                let name = HeaderName::try_from(name.as_str()).map_err(|e| e.to_string())?;
                let value = match scheme {
                    Some(s) => format!("{s} {key}"),
                    None => key.to_owned(),
                };
                (name, value)
            }
            Auth::Basic { user, user_env } => {
                let user = match (user, user_env) {
                    (Some(u), _) => u.clone(),
                    (None, Some(var)) => std::env::var(var)
                        .map_err(|_| format!("the variable {var} (auth user_env) is not set"))?,
                    (None, None) => String::new(),
                };
                let token =
                    base64::engine::general_purpose::STANDARD.encode(format!("{user}:{key}"));
                (AUTHORIZATION, format!("Basic {token}"))
            }
        }))
    }

    /// Where an OAuth connection's tokens come from (`None` for the other kinds), with
    /// `key` as the client secret.
    pub fn token_source(&self, key: &str) -> Result<Option<super::oauth::TokenSource>, Invalid> {
        self.token_source_or_why(key).map_err(Invalid::at("auth"))
    }

    fn token_source_or_why(&self, key: &str) -> Result<Option<super::oauth::TokenSource>, String> {
        let Auth::Oauth {
            token_url,
            client_id_env,
            scope,
            instance_url,
            instance_hosts,
        } = self
        else {
            return Ok(None);
        };
        let client_id = std::env::var(client_id_env)
            .map_err(|_| format!("the variable {client_id_env} (auth client_id_env) is not set"))?;
        Ok(Some(super::oauth::TokenSource {
            token_url: token_url.clone(),
            client_id,
            client_secret: key.to_owned(),
            scope: scope.clone(),
            use_instance_url: *instance_url,
            instance_hosts: instance_hosts.clone(),
            held: Default::default(),
            fetching: Default::default(),
        }))
    }
}

/// Headers courier or HTTP itself sets on every request, with why: neither a
/// connection's extra headers nor its `auth` may name them (what they sent would be
/// overwritten, doubled or break the request).
pub const OWNED_HEADERS: &[(&str, &str)] = &[
    ("Host", "HTTP sets it from the URL"),
    ("Content-Length", "HTTP sets it from the body"),
    ("Transfer-Encoding", "HTTP sets it from the body"),
    ("Connection", "the HTTP client manages its connections"),
    (
        "Content-Type",
        "courier sets it from the rule's request content_type",
    ),
    ("Idempotency-Key", "courier sends its own key per delivery"),
];

/// The header of [`OWNED_HEADERS`] `name` is (names ignore case), with why it is owned.
pub fn owned_header(name: &str) -> Option<(&'static str, &'static str)> {
    OWNED_HEADERS
        .iter()
        .find(|(owned, _)| owned.eq_ignore_ascii_case(name.trim()))
        .copied()
}

/// The error of an auth field that should name an environment variable; it never repeats
/// the value (a secret given in place of its variable's name would be echoed).
fn not_a_variable(field: &str) -> String {
    format!(
        "auth: {field} is not the name of an environment variable (letters, digits and _, \
         not starting with a digit); it names the variable, never the value itself"
    )
}

/// Checks a header auth's `scheme`: text a header value can hold before the key, without
/// repeating it.
fn check_scheme(scheme: &str) -> Result<(), String> {
    if scheme.contains(['\r', '\n']) {
        return Err("auth: scheme holds a line break, which a header value cannot".into());
    }
    if scheme.chars().any(char::is_control)
        || reqwest::header::HeaderValue::try_from(scheme).is_err()
    {
        return Err("auth: scheme holds a control character, which a header value cannot".into());
    }
    if scheme.trim().is_empty() || scheme.trim() != scheme {
        return Err(
            "auth: scheme is blank or starts or ends with a blank (leave it out to send the \
             key alone)"
                .into(),
        );
    }
    Ok(())
}

/// Checks a connection's base URL: an absolute `http://` or `https://` URL with a host,
/// and no blank, line break or control character anywhere (the URL parser would quietly
/// drop some of them). The error says what is wrong; it never repeats the URL, which may
/// carry a password.
pub fn check_base_url(url: &str) -> Result<(), Invalid> {
    check_base_url_or_why(url).map_err(Invalid::at("base_url"))
}

fn check_base_url_or_why(url: &str) -> Result<(), String> {
    if !(url.starts_with("http://") || url.starts_with("https://")) {
        return Err("must start with http:// or https://".into());
    }
    if url.contains(['\r', '\n']) {
        return Err("holds a line break".into());
    }
    if url.chars().any(char::is_control) {
        return Err("holds a control character".into());
    }
    if url.chars().any(char::is_whitespace) {
        return Err("holds a blank (write it %20)".into());
    }
    let parsed = reqwest::Url::parse(url).map_err(|e| format!("is not a valid URL: {e}"))?;
    if parsed.host_str().is_none_or(str::is_empty) {
        return Err("names no host".into());
    }
    if !parsed.username().is_empty() || parsed.password().is_some() {
        return Err("names a user or password (credentials belong in auth, never in a URL)".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn each_kind_presents_the_key_its_target_expects() {
        let header = |v| {
            Auth::parse(Some(&v))
                .unwrap()
                .header("k3y")
                .unwrap()
                .unwrap()
        };
        let (name, value) =
            header(json!({"kind": "header", "name": "Authorization", "scheme": "Klaviyo-API-Key"}));
        assert_eq!(
            (name.as_str(), value.as_str()),
            ("authorization", "Klaviyo-API-Key k3y")
        );
        let (name, value) = header(json!({"kind": "header", "name": "api-key"}));
        assert_eq!((name.as_str(), value.as_str()), ("api-key", "k3y"));
        // base64("anystring:k3y")
        let (_, value) = header(json!({"kind": "basic", "user": "anystring"}));
        assert_eq!(value, "Basic YW55c3RyaW5nOmszeQ==");
        assert_eq!(
            Auth::parse(None).unwrap().header("k3y").unwrap().unwrap().1,
            "Bearer k3y"
        );
    }

    #[test]
    fn an_auth_courier_cannot_use_is_refused_naming_what_is_wrong() {
        let e = Auth::parse(Some(&json!({"kind": "saml"}))).unwrap_err();
        assert!(e.reason.contains("unknown variant `saml`"), "{e}");
        assert_eq!(e.field, "auth");
        let e = Auth::parse(Some(&json!({"kind": "oauth", "client_id_env": "ID"}))).unwrap_err();
        assert!(e.reason.contains("missing field `token_url`"), "{e}");
        let e = Auth::parse(Some(&json!({"kind": "header", "name": "bad name"}))).unwrap_err();
        assert!(e.reason.contains("not a valid HTTP header name"), "{e}");
        let e = Auth::parse(Some(&json!({"kind": "basic"}))).unwrap_err();
        assert!(e.reason.contains("one of user and user_env"), "{e}");
        let e = Auth::parse(Some(
            &json!({"kind": "basic", "user": "u", "password": "p"}),
        ))
        .unwrap_err();
        assert!(e.reason.contains("unknown field `password`"), "{e}");
    }

    #[test]
    fn an_unknown_field_is_refused_for_every_kind_bearer_too() {
        let e = Auth::parse(Some(&json!({"kind": "bearer", "colour": 1}))).unwrap_err();
        assert!(e.reason.contains("unknown field `colour`"), "{e}");
        let e =
            Auth::parse(Some(&json!({"kind": "header", "name": "X", "shceme": "y"}))).unwrap_err();
        assert!(e.reason.contains("unknown field `shceme`"), "{e}");
        let e = Auth::parse(Some(&json!({
            "kind": "oauth", "token_url": "https://t.example.com/", "client_id_env": "ID",
            "scopes": "a"
        })))
        .unwrap_err();
        assert!(e.reason.contains("unknown field `scopes`"), "{e}");
        assert_eq!(
            Auth::parse(Some(&json!({"kind": "bearer"}))).unwrap(),
            Auth::Bearer
        );
    }

    #[test]
    fn a_scheme_a_header_value_cannot_hold_is_refused_without_echoing_it() {
        for (scheme, what) in [
            ("SECRET\r\nX-Injected: 1", "line break"),
            ("SECRET\n", "line break"),
            ("SECRET\u{7}", "control character"),
            ("SECRET\u{7f}", "control character"),
            ("SECRET\t", "control character"),
            (" SECRET", "blank"),
            ("", "blank"),
        ] {
            let e = Auth::parse(Some(
                &json!({"kind": "header", "name": "Authorization", "scheme": scheme}),
            ))
            .unwrap_err();
            assert!(
                e.reason.contains("scheme") && e.reason.contains(what),
                "{e}"
            );
            assert!(!e.reason.contains("SECRET"), "{e}");
        }
        Auth::parse(Some(
            &json!({"kind": "header", "name": "Authorization", "scheme": "Klaviyo-API-Key"}),
        ))
        .unwrap();
    }

    #[test]
    fn variables_must_be_variable_names_and_are_never_echoed() {
        for auth in [
            json!({"kind": "basic", "user_env": "SECRET-SITE"}),
            json!({"kind": "basic", "user_env": "9SECRET"}),
            json!({"kind": "basic", "user_env": ""}),
            json!({"kind": "oauth", "token_url": "https://t.example.com/",
                   "client_id_env": "SECRET ID"}),
        ] {
            let e = Auth::parse(Some(&auth)).unwrap_err();
            assert!(
                (e.reason.contains("user_env") || e.reason.contains("client_id_env"))
                    && e.reason.contains("not the name of an environment variable"),
                "{e}"
            );
            assert!(!e.reason.contains("SECRET"), "{e}");
        }
        let e = Auth::parse(Some(&json!({"kind": "basic", "user": "SECRET:x"}))).unwrap_err();
        assert!(
            e.reason.contains("user holds a colon") && !e.reason.contains("SECRET"),
            "{e}"
        );
        Auth::parse(Some(&json!({"kind": "basic", "user_env": "_CIO_SITE_2"}))).unwrap();
    }

    #[test]
    fn a_header_courier_or_http_owns_cannot_carry_the_key() {
        for name in [
            "Host",
            "host",
            "Content-Length",
            "Content-Type",
            "Transfer-Encoding",
            "Connection",
            "idempotency-key",
        ] {
            let e = Auth::parse(Some(&json!({"kind": "header", "name": name}))).unwrap_err();
            assert!(e.reason.contains("cannot carry the key"), "{name}: {e}");
        }
        Auth::parse(Some(&json!({"kind": "header", "name": "api-key"}))).unwrap();
    }
}
