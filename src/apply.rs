//! `courier apply`: a catalog file (connections and rules, as JSON) compared with what is
//! stored and saved in one transaction, all of it or nothing, through the catalog's own
//! checks. What changed is reported field by field; a dry run saves nothing.

use serde::{Deserialize, Serialize};
use sqlx::PgConnection;

use crate::catalog::{self, CatalogError, NewConnection, NewRule};

/// The declarative form the CLI applies: `courier apply FILE`.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct CatalogFile {
    /// Connections to create or update.
    #[serde(default)]
    pub connections: Vec<NewConnection>,
    /// Rules to create or update (after the connections).
    #[serde(default)]
    pub rules: Vec<NewRule>,
}

/// Applies a whole catalog file in one transaction: all of it or nothing. Everything is
/// checked as [`catalog::upsert_connection`] and [`catalog::upsert_rule`] check it; a connection's rules are
/// checked against its writer after the file's rules are saved, so one file may change a
/// connection's writer and its rules' paths together.
pub async fn apply(pool: &sqlx::PgPool, file: &CatalogFile) -> Result<(), CatalogError> {
    let mut tx = pool.begin().await?;
    save_all(&mut tx, file).await?;
    tx.commit().await?;
    Ok(())
}

/// Refuses a name given twice among a file's entries of `kind`.
fn named_once<'a>(kind: &str, names: impl Iterator<Item = &'a str>) -> Result<(), CatalogError> {
    let mut seen = std::collections::HashSet::new();
    for name in names {
        if !seen.insert(name) {
            return Err(CatalogError::Invalid(format!(
                "{kind} {name:?} is named twice in the file (each {kind} once)"
            )));
        }
    }
    Ok(())
}

/// How [`apply_file`] treats what a file leaves out, and whether it saves.
#[derive(Clone, Copy, Debug, Default)]
pub struct ApplyOptions {
    /// Fields a file leaves out take their defaults instead of keeping their stored values.
    pub replace: bool,
    /// Check and report the changes, save nothing.
    pub dry_run: bool,
}

/// What applying a file did (or would do) to one connection or rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change {
    /// `connection` or `rule`.
    pub kind: &'static str,
    /// Its name.
    pub name: String,
    /// `None`: created. `Some(empty)`: left alone. Otherwise `field: old -> new` lines
    /// (header values are never shown, only which headers changed).
    pub fields: Option<Vec<String>>,
}

impl std::fmt::Display for Change {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.fields {
            None => write!(f, "{} {:?}: created", self.kind, self.name),
            Some(fields) if fields.is_empty() => {
                write!(f, "{} {:?}: unchanged", self.kind, self.name)
            }
            Some(fields) => write!(
                f,
                "{} {:?}: changed {}",
                self.kind,
                self.name,
                fields.join("; ")
            ),
        }
    }
}

/// The raw entries of a catalog file, before they are merged with what is stored.
#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    /// A line saying what the file is for (a preset's), not applied.
    #[serde(default, rename = "about")]
    _about: Option<serde::de::IgnoredAny>,
    #[serde(default)]
    connections: Vec<serde_json::Map<String, serde_json::Value>>,
    #[serde(default)]
    rules: Vec<serde_json::Map<String, serde_json::Value>>,
}

/// Applies a catalog file's text (`courier apply`): unknown keys are refused by name;
/// fields a file leaves out keep their stored values unless `opts.replace`; everything is
/// checked and saved in one transaction (rolled back for `opts.dry_run`). Returns what
/// changed, entry by entry: empty for a file without entries (an empty text, `[]`, `{}`).
/// A connection or rule named twice is refused.
pub async fn apply_file(
    pool: &sqlx::PgPool,
    text: &str,
    opts: ApplyOptions,
) -> Result<Vec<Change>, CatalogError> {
    let not_a_file = |e: String| CatalogError::Invalid(format!("not a catalog file: {e}"));
    let start = text.trim_start();
    let raw: RawFile = if start.is_empty() {
        RawFile::default()
    } else if start.starts_with('{') {
        serde_json::from_str(text).map_err(|e| not_a_file(e.to_string()))?
    } else {
        // serde would read an array as the fields in order: only `[]` means nothing here.
        match serde_json::from_str::<serde_json::Value>(text) {
            Ok(serde_json::Value::Array(a)) if a.is_empty() => RawFile::default(),
            _ => {
                return Err(not_a_file(
                    "expected a JSON object, {\"connections\": [...], \"rules\": [...]}".into(),
                ));
            }
        }
    };
    let mut tx = pool.begin().await?;
    let mut changes = Vec::new();
    let mut file = CatalogFile::default();
    for entry in raw.connections {
        let name = entry_name(&entry, "connection")?;
        let stored = catalog::given_connection(&mut tx, &name).await?;
        let c: NewConnection = merged(&entry, stored.as_ref(), opts, "connection", &name)?;
        changes.push(change("connection", &name, stored.as_ref(), &c));
        file.connections.push(c);
    }
    for entry in raw.rules {
        let name = entry_name(&entry, "rule")?;
        let stored = catalog::given_rule(&mut tx, &name).await?;
        let r: NewRule = merged(&entry, stored.as_ref(), opts, "rule", &name)?;
        changes.push(change("rule", &name, stored.as_ref(), &r));
        file.rules.push(r);
    }
    save_all(&mut tx, &file).await?;
    if opts.dry_run {
        tx.rollback().await?;
    } else {
        tx.commit().await?;
    }
    Ok(changes)
}

fn entry_name(
    entry: &serde_json::Map<String, serde_json::Value>,
    kind: &str,
) -> Result<String, CatalogError> {
    entry
        .get("name")
        .and_then(|n| n.as_str())
        .map(str::to_owned)
        .ok_or_else(|| CatalogError::Invalid(format!("a {kind} without a \"name\"")))
}

/// The file's entry over the stored one (unless `replace`), read as `T`, whose unknown
/// fields are refused by name.
fn merged<T: serde::de::DeserializeOwned + Serialize>(
    entry: &serde_json::Map<String, serde_json::Value>,
    stored: Option<&T>,
    opts: ApplyOptions,
    kind: &str,
    name: &str,
) -> Result<T, CatalogError> {
    let mut fields = match (stored, opts.replace) {
        (Some(s), false) => match serde_json::to_value(s) {
            Ok(serde_json::Value::Object(m)) => m,
            _ => serde_json::Map::new(),
        },
        _ => serde_json::Map::new(),
    };
    fields.extend(entry.clone());
    serde_json::from_value(serde_json::Value::Object(fields))
        .map_err(|e| CatalogError::Invalid(format!("{kind} {name:?}: {e}")))
}

/// What saving `new` over `stored` changes, field by field.
fn change<T: Serialize>(kind: &'static str, name: &str, stored: Option<&T>, new: &T) -> Change {
    let Some(stored) = stored else {
        return Change {
            kind,
            name: name.to_owned(),
            fields: None,
        };
    };
    let (old, new) = (
        serde_json::to_value(stored).unwrap_or_default(),
        serde_json::to_value(new).unwrap_or_default(),
    );
    let mut fields = Vec::new();
    if let (Some(old), Some(new)) = (old.as_object(), new.as_object()) {
        for (key, value) in new {
            let before = old.get(key).unwrap_or(&serde_json::Value::Null);
            if before == value {
                continue;
            }
            if key == "headers" {
                // Values may be secrets: say which headers changed, not to what.
                let names = |v: &serde_json::Value| {
                    v.as_object()
                        .map(|m| m.keys().cloned().collect::<Vec<_>>())
                        .unwrap_or_default()
                };
                fields.push(format!(
                    "headers: [{}] -> [{}]",
                    names(before).join(", "),
                    names(value).join(", ")
                ));
            } else {
                fields.push(format!("{key}: {before} -> {value}"));
            }
        }
    }
    Change {
        kind,
        name: name.to_owned(),
        fields: Some(fields),
    }
}

/// Checks and saves a whole file inside the caller's transaction; a connection or rule
/// named twice is refused (the second would silently win), naming it.
async fn save_all(tx: &mut PgConnection, file: &CatalogFile) -> Result<(), CatalogError> {
    named_once(
        "connection",
        file.connections.iter().map(|c| c.name.as_str()),
    )?;
    named_once("rule", file.rules.iter().map(|r| r.name.as_str()))?;
    catalog::save_all(tx, &file.connections, &file.rules).await
}
