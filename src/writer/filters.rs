//! Filters in a request template's placeholder, which put a value in the target's types
//! and names: `{{payload | strings}}` (HubSpot's contact properties, strings only),
//! `{{payload | omit email | upper_keys}}` (Brevo's `attributes`, named in upper case).
//! Each filter follows a `|`, applied left to right; its arguments, where it takes any,
//! follow its name, separated by commas:
//!
//! - `strings`: every value as text (a field of an object, an item of a list, or the value
//!   itself): a string as it is, a number or a boolean as written in JSON, an object or a
//!   list as its JSON text; null stays null.
//! - `pick a,b`: only these fields of an object (an absent one stays absent).
//! - `omit a,b`: the object without these fields.
//! - `rename a:A,b:B`: these fields under their new names (an absent one stays absent).
//! - `upper_keys`, `lower_keys`: the object's field names in upper or lower case.
//! - `number`: a number as it is, a text holding one as that number (`{{delivery_id |
//!   number}}` sends `42`, not `"42"`).
//! - `entry`: an object of exactly one field as `{"name": <its name>, "value": <its value>}`
//!   (what a group's key names: one attribute and its value, [`super::group`]).
//! - `lower`: a text in lower case (other values as they are).
//! - `md5`, `sha256`: the lower-case hex digest of the value's text (a string as it is,
//!   anything else as its JSON text): Mailchimp names a member by
//!   `{{payload/email | lower | md5}}`.
//! - `soql`: a text as it may stand inside a quoted string of a Salesforce SOQL query, its
//!   backslashes and quotes escaped as the SOQL reference lists them (`o'brien@example.com`
//!   as `o\'brien@example.com`), so a value cannot end the string it is put in.
//!
//! A filter courier does not know, or one missing its arguments, is refused when the rule
//! is saved; an object filter given something else refuses that record alone.

use serde_json::{Map, Value};

/// One filter of a placeholder.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Filter {
    /// Every value as text.
    Strings,
    /// Only these fields.
    Pick(Vec<String>),
    /// Without these fields.
    Omit(Vec<String>),
    /// Fields renamed, old to new.
    Rename(Vec<(String, String)>),
    /// Field names in upper case.
    UpperKeys,
    /// Field names in lower case.
    LowerKeys,
    /// A number, from a number or a text holding one.
    Number,
    /// An object's only field as `{"name", "value"}`.
    Entry,
    /// A text in lower case.
    Lower,
    /// The MD5 hex digest of the value's text.
    Md5,
    /// The SHA-256 hex digest of the value's text.
    Sha256,
    /// A text escaped for a quoted SOQL string.
    Soql,
}

/// A placeholder's text split into what fills it (`payload/email`) and its filters; the
/// error names the filter at fault.
pub(super) fn split(placeholder: &str) -> Result<(&str, Vec<Filter>), String> {
    let mut parts = placeholder.split('|');
    let name = parts.next().unwrap_or_default().trim();
    let filters = parts.map(parse).collect::<Result<_, _>>()?;
    Ok((name, filters))
}

/// One filter as written (`omit email, phone`).
fn parse(text: &str) -> Result<Filter, String> {
    let text = text.trim();
    let (name, args) = text.split_once(' ').unwrap_or((text, ""));
    let list = || -> Result<Vec<String>, String> {
        let fields: Vec<String> = args
            .split(',')
            .map(|a| a.trim().to_owned())
            .filter(|a| !a.is_empty())
            .collect();
        match fields.is_empty() {
            true => Err(format!(
                "filter {name} names no field (e.g. `{name} email`)"
            )),
            false => Ok(fields),
        }
    };
    let bare = |f: Filter| match args.trim().is_empty() {
        true => Ok(f),
        false => Err(format!(
            "filter {name} takes no argument, and was given {args:?}"
        )),
    };
    match name {
        "strings" => bare(Filter::Strings),
        "upper_keys" => bare(Filter::UpperKeys),
        "lower_keys" => bare(Filter::LowerKeys),
        "number" => bare(Filter::Number),
        "entry" => bare(Filter::Entry),
        "lower" => bare(Filter::Lower),
        "md5" => bare(Filter::Md5),
        "sha256" => bare(Filter::Sha256),
        "soql" => bare(Filter::Soql),
        "pick" => Ok(Filter::Pick(list()?)),
        "omit" => Ok(Filter::Omit(list()?)),
        "rename" => list()?
            .into_iter()
            .map(|pair| match pair.split_once(':') {
                Some((from, to)) if !from.trim().is_empty() && !to.trim().is_empty() => {
                    Ok((from.trim().to_owned(), to.trim().to_owned()))
                }
                _ => Err(format!("filter rename takes old:new pairs, not {pair:?}")),
            })
            .collect::<Result<_, _>>()
            .map(Filter::Rename),
        "" => Err("an empty filter after |".into()),
        other => Err(format!(
            "unknown filter {other:?} (known: strings, pick, omit, rename, upper_keys, \
             lower_keys, number, entry, lower, md5, sha256, soql)"
        )),
    }
}

/// `value` through `filters`, in order; the error names the filter whose input is wrong.
pub(super) fn apply(mut value: Value, filters: &[Filter]) -> Result<Value, String> {
    for f in filters {
        value = match f {
            Filter::Strings => strings(value),
            Filter::Number => number(value)?,
            Filter::Entry => entry(value)?,
            Filter::Lower => match value {
                Value::String(s) => Value::String(s.to_lowercase()),
                other => other,
            },
            Filter::Md5 => Value::String(hex::<md5::Md5>(&value)),
            Filter::Sha256 => Value::String(hex::<sha2::Sha256>(&value)),
            Filter::Soql => match value {
                Value::String(s) => Value::String(soql(&s)),
                other => other,
            },
            other => Value::Object(fields(other, value)?),
        };
    }
    Ok(value)
}

/// `s` escaped for a quoted string of SOQL (Salesforce's SOQL and SOSL reference, "Quoted
/// String Escape Sequences"): newline, carriage return, tab, bell, backspace, form feed, `"`,
/// `'` and `\` by a backslash.
fn soql(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{7}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '"' | '\'' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            c => out.push(c),
        }
    }
    out
}

/// The lower-case hex digest by `D` of a value's text, for `md5` and `sha256`.
fn hex<D: sha2::Digest>(value: &Value) -> String {
    let text = match value {
        Value::String(s) => std::borrow::Cow::Borrowed(s.as_str()),
        other => std::borrow::Cow::Owned(other.to_string()),
    };
    D::digest(text.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A number, for `number`: a number as it is, a text holding one as that number.
fn number(value: Value) -> Result<Value, String> {
    let parsed = match &value {
        Value::Number(_) => return Ok(value),
        Value::String(s) => serde_json::from_str::<serde_json::Number>(s.trim()).ok(),
        _ => None,
    };
    parsed.map(Value::Number).ok_or_else(|| {
        format!(
            "filter number takes a number or a text holding one, and this record gives {}",
            kind(&value)
        )
    })
}

/// An object's only field, for `entry`: `{"name": <name>, "value": <value>}`.
fn entry(value: Value) -> Result<Value, String> {
    match value {
        Value::Object(m) if m.len() == 1 => {
            let (name, value) = m.into_iter().next().expect("one field");
            Ok(serde_json::json!({"name": name, "value": value}))
        }
        Value::Object(m) => Err(format!(
            "filter entry takes an object of exactly one field, and this record's has {}",
            m.len()
        )),
        other => Err(format!(
            "filter entry takes an object of exactly one field, and this record gives {}",
            kind(&other)
        )),
    }
}

/// A value's text, for `strings`.
fn strings(value: Value) -> Value {
    match value {
        Value::Object(m) => Value::Object(m.into_iter().map(|(k, v)| (k, text(v))).collect()),
        Value::Array(a) => Value::Array(a.into_iter().map(text).collect()),
        other => text(other),
    }
}

/// One value as text: a string as it is, null as null, anything else as its JSON.
fn text(v: Value) -> Value {
    match v {
        Value::String(_) | Value::Null => v,
        other => Value::String(other.to_string()),
    }
}

/// An object filter applied to `value`.
fn fields(f: &Filter, value: Value) -> Result<Map<String, Value>, String> {
    let Value::Object(mut m) = value else {
        return Err(format!(
            "filter {} takes an object, and this record gives {}",
            name(f),
            kind(&value)
        ));
    };
    Ok(match f {
        Filter::Pick(keep) => keep
            .iter()
            .filter_map(|k| m.remove_entry(k.as_str()))
            .collect(),
        Filter::Omit(drop) => {
            m.retain(|k, _| !drop.contains(k));
            m
        }
        Filter::Rename(pairs) => {
            for (from, to) in pairs {
                if let Some(v) = m.remove(from.as_str()) {
                    m.insert(to.clone(), v);
                }
            }
            m
        }
        Filter::UpperKeys => m.into_iter().map(|(k, v)| (k.to_uppercase(), v)).collect(),
        Filter::LowerKeys => m.into_iter().map(|(k, v)| (k.to_lowercase(), v)).collect(),
        Filter::Strings
        | Filter::Number
        | Filter::Entry
        | Filter::Lower
        | Filter::Md5
        | Filter::Sha256
        | Filter::Soql => m,
    })
}

/// A filter's name as written.
fn name(f: &Filter) -> &'static str {
    match f {
        Filter::Strings => "strings",
        Filter::Pick(_) => "pick",
        Filter::Omit(_) => "omit",
        Filter::Rename(_) => "rename",
        Filter::UpperKeys => "upper_keys",
        Filter::LowerKeys => "lower_keys",
        Filter::Number => "number",
        Filter::Entry => "entry",
        Filter::Lower => "lower",
        Filter::Md5 => "md5",
        Filter::Sha256 => "sha256",
        Filter::Soql => "soql",
    }
}

/// What kind of JSON value `v` is, in words.
fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn soql_escapes_what_would_end_a_quoted_string() {
        let (_, filters) = split("payload/email | soql").unwrap();
        let filled = apply(
            Value::String("o'brien\\x\"y\n@example.com".into()),
            &filters,
        );
        assert_eq!(
            filled.unwrap(),
            Value::String("o\\'brien\\\\x\\\"y\\n@example.com".into())
        );
        assert_eq!(soql("ann@example.com"), "ann@example.com");
    }

    fn run(placeholder: &str, v: Value) -> Result<Value, String> {
        let (_, filters) = split(placeholder)?;
        apply(v, &filters)
    }

    #[test]
    fn strings_puts_every_value_in_text() {
        let v = json!({"email": "a@x", "age": 42, "vip": true, "score": 1.5, "gone": null,
                       "tags": ["a", 1], "address": {"city": "Oslo"}});
        assert_eq!(
            run("payload | strings", v).unwrap(),
            json!({"email": "a@x", "age": "42", "vip": "true", "score": "1.5", "gone": null,
                   "tags": "[\"a\",1]", "address": "{\"city\":\"Oslo\"}"})
        );
        assert_eq!(run("payload/n|strings", json!(7)).unwrap(), json!("7"));
    }

    #[test]
    fn object_filters_pick_omit_rename_and_case_keys() {
        let v = json!({"email": "a@x", "firstname": "Ada", "lastname": "L", "phone": "+47"});
        assert_eq!(
            run(
                "payload | omit email | rename phone:SMS | upper_keys",
                v.clone()
            )
            .unwrap(),
            json!({"FIRSTNAME": "Ada", "LASTNAME": "L", "SMS": "+47"})
        );
        assert_eq!(
            run("payload | pick email, missing, phone", v.clone()).unwrap(),
            json!({"email": "a@x", "phone": "+47"})
        );
        assert_eq!(
            run("payload | upper_keys | lower_keys", v.clone()).unwrap(),
            v
        );
    }

    #[test]
    fn number_and_entry_put_a_value_in_the_shape_a_target_reads() {
        assert_eq!(run("delivery_id | number", json!("42")).unwrap(), json!(42));
        assert_eq!(run("payload/n | number", json!(1.5)).unwrap(), json!(1.5));
        let e = run("payload/n | number", json!("4x")).unwrap_err();
        assert!(e.contains("filter number") && e.contains("a string"), "{e}");
        assert_eq!(
            run(
                "payload/attributes | entry",
                json!({"email_consent": false})
            )
            .unwrap(),
            json!({"name": "email_consent", "value": false})
        );
        for v in [json!({}), json!({"a": 1, "b": 2}), json!([1])] {
            let e = run("payload | entry", v.clone()).unwrap_err();
            assert!(e.contains("exactly one field"), "{v}: {e}");
        }
    }

    #[test]
    fn bad_filters_are_named() {
        for (text, want) in [
            ("payload | shout", "unknown filter \"shout\""),
            ("payload | pick", "filter pick names no field"),
            ("payload | rename a", "old:new pairs"),
            ("payload | strings x", "takes no argument"),
            ("payload |", "an empty filter"),
        ] {
            let e = split(text).unwrap_err();
            assert!(e.contains(want), "{text}: {e}");
        }
        let e = run("payload/n | omit a", json!(3)).unwrap_err();
        assert!(
            e.contains("omit takes an object") && e.contains("a number"),
            "{e}"
        );
    }

    #[test]
    fn a_value_is_lowered_and_hashed_as_vendors_name_a_person() {
        let f = |p: &str, v: Value| {
            let (_, filters) = split(p).unwrap();
            apply(v, &filters).unwrap()
        };
        // Mailchimp's subscriber hash: the MD5 of the lower-cased e-mail (RFC 1321's
        // test suite gives MD5("abc")).
        assert_eq!(
            f("payload | lower | md5", json!("ABC")),
            json!("900150983cd24fb0d6963f7d28e17f72")
        );
        assert_eq!(
            f("payload | md5", json!("")),
            json!("d41d8cd98f00b204e9800998ecf8427e")
        );
        // FIPS 180-2's example: SHA-256("abc").
        assert_eq!(
            f("payload | sha256", json!("abc")),
            json!("ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad")
        );
        // A number hashes as its JSON text; lower leaves what is not text alone.
        assert_eq!(
            f("payload | md5", json!(42)),
            f("payload | md5", json!("42"))
        );
        assert_eq!(f("payload | lower", json!(7)), json!(7));
        assert!(
            split("payload | md5 x")
                .unwrap_err()
                .contains("takes no argument")
        );
    }
}
