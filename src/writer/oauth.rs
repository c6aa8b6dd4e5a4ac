//! OAuth 2 client credentials (a connection's auth kind `oauth`): a token fetched from the
//! connection's token URL with its client id and the key as the client secret, kept in
//! this process's memory until shortly before it expires (never stored, never logged),
//! fetched again once when the target answers 401. Salesforce's answer also names the
//! instance's URL, which then takes the place of the base URL's origin.

use std::{
    collections::HashMap,
    sync::{LazyLock, Mutex},
    time::{Duration, Instant},
};

use super::WriteError;

/// A token is renewed this long before the target says it expires.
const RENEW_BEFORE: Duration = Duration::from_secs(60);
/// How long a token is kept when its answer names no lifetime.
const DEFAULT_LIFETIME: Duration = Duration::from_secs(3600);

/// Where a connection's tokens come from.
#[derive(Clone, Debug)]
pub struct TokenSource {
    /// Whose tokens these are: the connection and its client (the cache's key).
    pub key: String,
    /// The token endpoint.
    pub token_url: String,
    /// The client id.
    pub client_id: String,
    /// The client secret (the connection's key).
    pub client_secret: String,
    /// The scope asked for, if any.
    pub scope: Option<String>,
}

/// A token in force.
#[derive(Clone, Debug)]
pub struct Token {
    /// The bearer token.
    pub access: String,
    /// The instance's URL, when the answer names one.
    pub instance_url: Option<String>,
    /// Until when it is used.
    until: Instant,
}

/// Every connection's token in force, in this process only.
static TOKENS: LazyLock<Mutex<HashMap<String, Token>>> = LazyLock::new(Default::default);
/// Held while a token is fetched, so calls that find none wait for one fetch.
static FETCHING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

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
        let _one = FETCHING.lock().await;
        // Another call may have fetched one meanwhile.
        if let Some(t) = self.cached(refused) {
            return Ok(t);
        }
        let token = self.fetch(client).await?;
        TOKENS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(self.key.clone(), token.clone());
        Ok(token)
    }

    /// The cached token, unless expired or the one `refused`.
    fn cached(&self, refused: Option<&str>) -> Option<Token> {
        let tokens = TOKENS.lock().unwrap_or_else(|e| e.into_inner());
        tokens
            .get(&self.key)
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
            .map(|(k, v)| format!("{k}={}", super::request::encode(v)))
            .collect::<Vec<_>>()
            .join("&");
        let answer = client
            .post(&self.token_url)
            .header(
                reqwest::header::CONTENT_TYPE,
                "application/x-www-form-urlencoded",
            )
            .body(body)
            .timeout(Duration::from_secs(30))
            .send()
            .await
            .map_err(|e| WriteError::Transient {
                status: None,
                message: format!("fetching an OAuth token: {}", e.without_url()),
            })?;
        let status = answer.status().as_u16();
        if !answer.status().is_success() {
            // The token endpoint's answer is not quoted: it may echo the credentials.
            let message = format!("the token endpoint answered {status}");
            return Err(match status {
                400..=499 => WriteError::Permanent {
                    status: Some(status),
                    message: format!("{message}: check the client id and secret"),
                },
                _ => WriteError::Transient {
                    status: Some(status),
                    message,
                },
            });
        }
        let json: serde_json::Value = answer.json().await.map_err(|_| WriteError::Transient {
            status: Some(status),
            message: "the token endpoint's answer is not JSON".into(),
        })?;
        let access = json["access_token"]
            .as_str()
            .filter(|t| !t.is_empty())
            .ok_or_else(|| WriteError::Transient {
                status: Some(status),
                message: "the token endpoint's answer names no access_token".into(),
            })?;
        let lifetime = json["expires_in"]
            .as_u64()
            .map_or(DEFAULT_LIFETIME, Duration::from_secs);
        Ok(Token {
            access: access.to_owned(),
            instance_url: json["instance_url"].as_str().map(str::to_owned),
            until: Instant::now() + lifetime.saturating_sub(RENEW_BEFORE),
        })
    }
}
