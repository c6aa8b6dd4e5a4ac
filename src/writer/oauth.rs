//! OAuth 2 client credentials (a connection's auth kind `oauth`): a token fetched from the
//! connection's token URL with its client id and the key as the client secret, kept with
//! the connection's writer in this process's memory (the engine keeps a writer while its
//! connection is unchanged) until shortly before it expires (never stored, never logged),
//! fetched again once when the target answers 401. An answer may also name the instance's
//! URL (Salesforce does), which then takes the place of the base URL's origin when the
//! connection asks for it (`instance_url`).
//!
//! A token endpoint is not trusted more than a target: its answer is read up to
//! [`TOKEN_ANSWER_LIMIT`], a lifetime beyond [`MAX_LIFETIME`] is cut to it, an instance URL
//! is used only when it is `https` (`http` on loopback), names no user or password, and
//! stands on a host the connection allows ([`allows_host`]); each connection fetches its
//! tokens one at a time, so one slow endpoint holds back no other connection.

use std::{
    net::IpAddr,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use super::wire::{WriteError, read_capped};

/// A token is renewed this long before the target says it expires.
const RENEW_BEFORE: Duration = Duration::from_secs(60);
/// How long a token is kept when its answer names no lifetime.
const DEFAULT_LIFETIME: Duration = Duration::from_secs(3600);
/// The longest a token is kept, whatever its answer says.
pub const MAX_LIFETIME: Duration = Duration::from_secs(86_400);
/// The most of a token answer courier reads.
pub const TOKEN_ANSWER_LIMIT: usize = 64 * 1024;
/// How long one token request may take.
const TOKEN_TIMEOUT: Duration = Duration::from_secs(30);

/// Where a connection's tokens come from.
#[derive(Clone, Debug)]
pub struct TokenSource {
    /// The token endpoint.
    pub token_url: String,
    /// The client id.
    pub client_id: String,
    /// The client secret (the connection's key).
    pub client_secret: String,
    /// The scope asked for, if any.
    pub scope: Option<String>,
    /// Whether the answer's instance URL replaces the base URL's origin.
    pub use_instance_url: bool,
    /// The hosts an instance URL may name (`.example.com`: it and its subdomains); empty:
    /// the token URL's host and the subdomains of its parent domain.
    pub instance_hosts: Vec<String>,
    /// The token in force, shared by the writer's calls; it goes with the writer (which
    /// the engine keeps while its connection is unchanged).
    pub held: Arc<Mutex<Option<Token>>>,
    /// Held while a token is fetched, so calls that find none wait for one fetch.
    pub fetching: Arc<tokio::sync::Mutex<()>>,
}

/// A token in force.
#[derive(Clone, Debug)]
pub struct Token {
    /// The bearer token.
    pub access: String,
    /// The instance's origin (`https://na1.my.salesforce.com`), when the connection uses
    /// one and the answer names an allowed one.
    pub instance_url: Option<String>,
    /// Until when it is used.
    until: Instant,
}

impl TokenSource {
    /// The token in force, fetched when there is none, it is about to expire, or it is
    /// `refused` (the target answered 401 to it). Calls in flight at once share one fetch.
    pub async fn token(
        &self,
        client: &reqwest::Client,
        refused: Option<&str>,
    ) -> Result<Token, WriteError> {
        if let Some(t) = self.cached(refused) {
            return Ok(t);
        }
        let _one = self.fetching.lock().await;
        // Another call may have fetched one meanwhile.
        if let Some(t) = self.cached(refused) {
            return Ok(t);
        }
        let token = self.fetch(client).await?;
        *self.held.lock().unwrap_or_else(|e| e.into_inner()) = Some(token.clone());
        Ok(token)
    }

    /// The cached token, unless expired or the one `refused`.
    fn cached(&self, refused: Option<&str>) -> Option<Token> {
        let held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        held.as_ref()
            .filter(|t| t.until > Instant::now() && Some(t.access.as_str()) != refused)
            .cloned()
    }

    async fn fetch(&self, client: &reqwest::Client) -> Result<Token, WriteError> {
        let mut form = vec![
            ("grant_type", "client_credentials"),
            ("client_id", self.client_id.as_str()),
            ("client_secret", self.client_secret.as_str()),
        ];
        if let Some(scope) = &self.scope {
            form.push(("scope", scope));
        }
        let body = form
            .iter()
            .map(|(k, v)| format!("{k}={}", super::template::encode(v)))
            .collect::<Vec<_>>()
            .join("&");
        let answer = client
            .post(&self.token_url)
            .header(
                reqwest::header::CONTENT_TYPE,
                "application/x-www-form-urlencoded",
            )
            .body(body)
            .timeout(TOKEN_TIMEOUT)
            .send()
            .await
            .map_err(|e| WriteError::Transient {
                status: None,
                message: format!("fetching an OAuth token: {}", e.without_url()),
            })?;
        let status = answer.status().as_u16();
        let transient = |message: String| WriteError::Transient {
            status: Some(status),
            message,
        };
        if !answer.status().is_success() {
            // The token endpoint's answer is not quoted: it may echo the credentials.
            let message = format!("the token endpoint answered {status}");
            return Err(match status {
                400..=499 => WriteError::Permanent {
                    status: Some(status),
                    message: format!("{message}: check the client id and secret"),
                },
                _ => transient(message),
            });
        }
        let bytes = read_capped(answer, TOKEN_ANSWER_LIMIT)
            .await
            .map_err(|(_, why)| transient(format!("the token endpoint's answer: {why}")))?;
        let json: serde_json::Value = serde_json::from_slice(&bytes)
            .map_err(|_| transient("the token endpoint's answer is not JSON".into()))?;
        let access = json["access_token"]
            .as_str()
            .filter(|t| !t.is_empty())
            .ok_or_else(|| transient("the token endpoint's answer names no access_token".into()))?;
        let instance_url = match (self.use_instance_url, &json["instance_url"]) {
            (false, _) | (true, serde_json::Value::Null) => None,
            (true, serde_json::Value::String(url)) => {
                Some(self.instance_origin(url).map_err(|why| {
                    transient(format!(
                        "the token answer's instance_url {why}; nothing was sent"
                    ))
                })?)
            }
            (true, _) => {
                return Err(transient(
                    "the token answer's instance_url is not a string; nothing was sent".into(),
                ));
            }
        };
        Ok(Token {
            access: access.to_owned(),
            instance_url,
            until: expiry(&json["expires_in"], Instant::now()),
        })
    }

    /// The origin of an instance URL a token answer names, when it may be used: `https`
    /// (`http` on loopback), no user or password, no path, query or fragment beyond `/`,
    /// on an allowed host. The error names the host, never the token.
    fn instance_origin(&self, raw: &str) -> Result<String, String> {
        let url = reqwest::Url::parse(raw).map_err(|e| format!("is not a URL ({e})"))?;
        let host = url.host_str().unwrap_or_default().to_owned();
        if !url.username().is_empty() || url.password().is_some() {
            return Err(format!("on host {host:?} names a user or password"));
        }
        match url.scheme() {
            "https" => {}
            "http" if is_loopback(&host) => {}
            other => return Err(format!("on host {host:?} is {other}, not https")),
        }
        if url.path() != "/" || url.query().is_some() || url.fragment().is_some() {
            return Err(format!(
                "on host {host:?} has a path, query or fragment (an origin is expected)"
            ));
        }
        let token_host = reqwest::Url::parse(&self.token_url)
            .ok()
            .and_then(|u| u.host_str().map(str::to_owned))
            .unwrap_or_default();
        if !allows_host(&host, &token_host, &self.instance_hosts) {
            return Err(format!(
                "names host {host:?}, which the connection does not allow (auth instance_hosts)"
            ));
        }
        Ok(url.origin().ascii_serialization())
    }
}

/// Until when a token with lifetime `expires_in` (seconds; absent: an hour) is used from
/// `now`: renewed a minute early, never kept beyond [`MAX_LIFETIME`], whatever number the
/// endpoint sent.
fn expiry(expires_in: &serde_json::Value, now: Instant) -> Instant {
    let lifetime = match expires_in {
        serde_json::Value::Number(n) => n
            .as_f64()
            .filter(|s| s.is_finite() && *s >= 0.0)
            .map_or(Duration::ZERO, |s| {
                Duration::from_secs_f64(s.min(MAX_LIFETIME.as_secs_f64()))
            }),
        serde_json::Value::String(s) => s.trim().parse::<u64>().map_or(DEFAULT_LIFETIME, |s| {
            Duration::from_secs(s.min(MAX_LIFETIME.as_secs()))
        }),
        _ => DEFAULT_LIFETIME,
    };
    now.checked_add(lifetime.saturating_sub(RENEW_BEFORE))
        .unwrap_or(now)
}

/// Whether an instance URL on `host` may be used for a connection whose token URL is on
/// `token_host`: a host of `allowed` (`.example.com`: it and its subdomains), or, when
/// none is listed, the token URL's host itself and the subdomains of its parent domain
/// (`login.salesforce.com` allows `*.salesforce.com`). An IP address allows only itself.
pub fn allows_host(host: &str, token_host: &str, allowed: &[String]) -> bool {
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    let under = |suffix: &str| {
        let suffix = suffix.trim_start_matches('.').to_ascii_lowercase();
        !suffix.is_empty() && (host == suffix || host.ends_with(&format!(".{suffix}")))
    };
    if !allowed.is_empty() {
        return allowed.iter().any(|a| match a.starts_with('.') {
            true => under(a),
            false => host == a.to_ascii_lowercase(),
        });
    }
    let token_host = token_host.trim_end_matches('.').to_ascii_lowercase();
    if token_host.parse::<IpAddr>().is_ok()
        || token_host
            .trim_matches(['[', ']'])
            .parse::<IpAddr>()
            .is_ok()
    {
        return host == token_host;
    }
    let labels: Vec<&str> = token_host.split('.').collect();
    match labels.len() {
        0..=2 => under(&token_host),
        n => under(&labels[n - 2..].join(".")),
    }
}

/// Whether `host` is this machine (`localhost`, 127.0.0.0/8, `::1`).
fn is_loopback(host: &str) -> bool {
    host.eq_ignore_ascii_case("localhost")
        || host
            .trim_matches(['[', ']'])
            .parse::<IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lifetime_of_any_size_is_bounded() {
        let now = Instant::now();
        for huge in [
            serde_json::json!(18446744073709551615u64),
            serde_json::json!(1e300),
            serde_json::json!("18446744073709551615"),
        ] {
            let until = expiry(&huge, now);
            assert!(until <= now + MAX_LIFETIME, "{huge}");
            assert!(until > now + Duration::from_secs(3600), "{huge}");
        }
        assert_eq!(expiry(&serde_json::json!(-5), now), now);
        assert_eq!(expiry(&serde_json::json!(30), now), now);
        let hour = expiry(&serde_json::Value::Null, now);
        assert_eq!(hour, now + DEFAULT_LIFETIME - RENEW_BEFORE);
    }

    #[test]
    fn an_instance_host_must_be_the_token_urls_site_or_listed() {
        let none: &[String] = &[];
        assert!(allows_host(
            "na1.my.salesforce.com",
            "login.salesforce.com",
            none
        ));
        assert!(allows_host("salesforce.com", "login.salesforce.com", none));
        assert!(!allows_host("evil.com", "login.salesforce.com", none));
        assert!(!allows_host(
            "salesforce.com.evil.com",
            "login.salesforce.com",
            none
        ));
        assert!(!allows_host(
            "evilsalesforce.com",
            "login.salesforce.com",
            none
        ));
        assert!(allows_host("127.0.0.1", "127.0.0.1", none));
        assert!(!allows_host("127.0.0.2", "127.0.0.1", none));
        let listed = ["api.example.org".to_owned(), ".crm.example.net".to_owned()];
        assert!(allows_host(
            "api.example.org",
            "login.salesforce.com",
            &listed
        ));
        assert!(allows_host(
            "eu.crm.example.net",
            "login.salesforce.com",
            &listed
        ));
        assert!(!allows_host(
            "na1.salesforce.com",
            "login.salesforce.com",
            &listed
        ));
    }

    #[test]
    fn an_instance_url_is_an_https_origin_without_credentials() {
        let source = TokenSource {
            token_url: "https://login.salesforce.com/services/oauth2/token".into(),
            client_id: "id".into(),
            client_secret: "s".into(),
            scope: None,
            use_instance_url: true,
            instance_hosts: Vec::new(),
            held: Default::default(),
            fetching: Default::default(),
        };
        assert_eq!(
            source
                .instance_origin("https://na1.my.salesforce.com")
                .unwrap(),
            "https://na1.my.salesforce.com"
        );
        for (bad, why) in [
            ("http://na1.my.salesforce.com", "not https"),
            ("https://good@na1.my.salesforce.com", "user or password"),
            ("https://na1.my.salesforce.com/evil?x=", "path, query"),
            (
                "https://other-host:8443",
                "\"other-host\", which the connection does not allow",
            ),
            ("ftp://na1.my.salesforce.com", "not https"),
            ("garbage", "not a URL"),
        ] {
            let e = source.instance_origin(bad).unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }
}
