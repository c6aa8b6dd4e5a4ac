//! Ready targets: for each CRM shops feed, a catalog file in `courier apply`'s format
//! (`presets/<name>.json` in the repository): its connection (base URL, limits, how the
//! key is presented) and its rules (path, records per call, request shape, answer map).
//! `courier apply --preset NAME` saves one as it is; `courier connection add --preset` and
//! `courier rule add --preset` take one entry as the defaults of a new one; `courier
//! preset show NAME` prints it to copy and change for a target courier has never seen.

use crate::invalid::Invalid;
use serde_json::{Map, Value};

/// One ready target.
#[derive(Clone, Copy, Debug)]
pub struct Preset {
    /// Its name (`hubspot`).
    pub name: &'static str,
    /// The catalog file.
    pub text: &'static str,
}

/// Every preset, by name: each file of `presets/` (build.rs lists them).
pub const PRESETS: &[Preset] = include!(concat!(env!("OUT_DIR"), "/presets.rs"));

const fn preset(name: &'static str, text: &'static str) -> Preset {
    Preset { name, text }
}

/// The preset named `name`; the error lists the known ones.
pub fn find(name: &str) -> Result<&'static Preset, Invalid> {
    find_or_why(name).map_err(Invalid::at("preset"))
}

fn find_or_why(name: &str) -> Result<&'static Preset, String> {
    PRESETS.iter().find(|p| p.name == name).ok_or_else(|| {
        let names: Vec<&str> = PRESETS.iter().map(|p| p.name).collect();
        format!("no preset {name:?} (presets: {})", names.join(", "))
    })
}

impl Preset {
    fn json(&self) -> Value {
        serde_json::from_str(self.text).expect("a preset is JSON (tested)")
    }

    /// What it is for, in a line.
    pub fn about(&self) -> String {
        self.json()["about"].as_str().unwrap_or_default().to_owned()
    }

    /// Its entries of `kind` (`connections`, `rules`).
    fn entries(&self, kind: &str) -> Vec<Map<String, Value>> {
        self.json()[kind]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|e| e.as_object().cloned())
            .collect()
    }

    /// The names of its rules.
    pub fn rules(&self) -> Vec<String> {
        self.entries("rules")
            .iter()
            .filter_map(|r| r.get("name")?.as_str().map(str::to_owned))
            .collect()
    }

    /// Its connection, with the fields of `over` (those set) over it.
    pub fn connection(&self, over: &Value) -> Map<String, Value> {
        let mut c = self.entries("connections").remove(0);
        merge(&mut c, over);
        c
    }

    /// Its rule `rule` (`None`: the first), with the fields of `over` (those set) over it.
    pub fn rule(&self, rule: Option<&str>, over: &Value) -> Result<Map<String, Value>, Invalid> {
        self.rule_or_why(rule, over).map_err(Invalid::at("rule"))
    }

    fn rule_or_why(&self, rule: Option<&str>, over: &Value) -> Result<Map<String, Value>, String> {
        let rules = self.entries("rules");
        let mut r = match rule {
            None => rules.into_iter().next(),
            Some(name) => rules
                .into_iter()
                .find(|r| r.get("name").and_then(Value::as_str) == Some(name)),
        }
        .ok_or_else(|| {
            format!(
                "preset {} has no rule {:?} (its rules: {})",
                self.name,
                rule.unwrap_or_default(),
                self.rules().join(", ")
            )
        })?;
        merge(&mut r, over);
        Ok(r)
    }
}

/// Puts the fields of `over` that are set (not null, not an empty list or object) into
/// `base`.
fn merge(base: &mut Map<String, Value>, over: &Value) {
    for (k, v) in over.as_object().into_iter().flatten() {
        let unset = match v {
            Value::Null => true,
            Value::Array(a) => a.is_empty(),
            Value::Object(o) => o.is_empty(),
            _ => false,
        };
        if !unset {
            base.insert(k.clone(), v.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{apply::CatalogFile, catalog::check_connection};

    #[test]
    fn every_preset_is_a_catalog_file_whose_entries_pass_the_door() {
        for p in PRESETS {
            let mut v = p.json();
            assert!(!p.about().is_empty(), "{}: about", p.name);
            v.as_object_mut().unwrap().remove("about");
            let file: CatalogFile =
                serde_json::from_value(v).unwrap_or_else(|e| panic!("preset {}: {e}", p.name));
            for c in &file.connections {
                check_connection(c).unwrap_or_else(|e| panic!("preset {}: {e}", p.name));
            }
            for r in &file.rules {
                let c = &file.connections[0];
                crate::profile::RuleProfile::parse(crate::profile::Stored {
                    writer: &c.writer,
                    path: &r.path,
                    records_per_call: r.records_per_call.unwrap_or(1),
                    request: r.request.as_ref(),
                    answer: r.answer.as_ref(),
                    job: r.job.as_ref(),
                })
                .unwrap_or_else(|e| panic!("preset {} rule {}: {e}", p.name, r.name));
            }
        }
    }

    #[test]
    fn an_entry_is_the_preset_with_what_is_given_over_it() {
        let hubspot = find("hubspot").unwrap();
        let c =
            hubspot.connection(&serde_json::json!({"name": "hs", "base_url": null, "limits": []}));
        assert_eq!(c["name"], "hs");
        assert_eq!(c["base_url"], "https://api.hubapi.com/");
        let r = hubspot
            .rule(
                Some("hubspot-events"),
                &serde_json::json!({"connection": "hs"}),
            )
            .unwrap();
        assert_eq!(
            (r["connection"].as_str(), r["path"].as_str()),
            (Some("hs"), Some("events/v3/send/batch"))
        );
        assert!(
            find("hubspt")
                .unwrap_err()
                .reason
                .contains("presets: braze, brevo")
        );
        assert!(
            hubspot
                .rule(Some("deals"), &Value::Null)
                .unwrap_err()
                .reason
                .contains("hubspot-contacts")
        );
    }
}
