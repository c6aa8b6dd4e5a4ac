//! A rule's typed profile: what its calls are (its writer, how many records one carries, how
//! each request is shaped, how each answer is read), parsed once from what is stored. The
//! catalog parses it before a rule is saved; a chain job parses it when it loads its run
//! and carries the typed values, never the JSON. A rule written by plain SQL past the
//! catalog fails to parse here, and its run ends with the rule unusable and the reason.

use serde_json::Value;

use crate::invalid::Invalid;
use crate::writer::{
    Call, Outgoing, WriterKind,
    answer::{self, AnswerMap, Refusal},
    http::MAX_RECORDS_PER_JOB,
    job::JobShape,
    request::RequestShape,
};

/// What a rule's calls are.
#[derive(Clone, Debug, PartialEq)]
pub struct RuleProfile {
    /// Its connection's writer.
    pub writer: WriterKind,
    /// The most records one call carries (at least 1, at most what the writer allows).
    pub records_per_call: usize,
    /// How its requests are shaped (the plain shape for a writer of its own).
    pub request: RequestShape,
    /// How its answers name each record's fate; `None`: the generic per-item array.
    pub answer: Option<AnswerMap>,
    /// Error answers that refuse records of a call rather than the request: such a call
    /// is split like one refused for its content.
    pub refusals: Vec<Refusal>,
    /// How it delivers through the target's asynchronous jobs; `None`: its calls are
    /// synchronous.
    pub job: Option<JobShape>,
}

/// A rule's profile as stored: its connection's writer and the rule's own columns.
#[derive(Clone, Copy, Debug)]
pub struct Stored<'a> {
    /// The connection's writer, by name.
    pub writer: &'a str,
    /// The rule's path or operation.
    pub path: &'a str,
    /// The most records per call.
    pub records_per_call: i32,
    /// Its request shape, if stated.
    pub request: Option<&'a Value>,
    /// Its answer map, if stated.
    pub answer: Option<&'a Value>,
    /// Its job shape, if stated.
    pub job: Option<&'a Value>,
}

impl<'a> Stored<'a> {
    /// Stored rule `rule`'s profile, on its connection `connection`.
    pub fn of(rule: &'a crate::model::Rule, connection: &'a crate::model::Connection) -> Self {
        Stored {
            writer: &connection.writer,
            path: &rule.path,
            records_per_call: rule.records_per_call,
            request: rule.request.as_ref(),
            answer: rule.answer.as_ref(),
            job: rule.job.as_ref(),
        }
    }
}

impl Stored<'_> {
    /// What the profile is parsed from, as one text: equal texts parse alike.
    pub fn fingerprint(&self) -> String {
        serde_json::json!([
            self.writer,
            self.path,
            self.records_per_call,
            self.request,
            self.answer,
            self.job
        ])
        .to_string()
    }
}

impl RuleProfile {
    /// Parses a stored profile, checking each field against the writer; the error names
    /// the first field at fault.
    pub fn parse(s: Stored<'_>) -> Result<Self, Invalid> {
        let writer = WriterKind::parse(s.writer)?;
        check_path(s.path).map_err(Invalid::at("path"))?;
        let job = s.job.map(JobShape::parse).transpose()?;
        let (max, why) = match job {
            Some(_) => (MAX_RECORDS_PER_JOB, "a job takes at most that many records"),
            None => writer.max_records_per_call(),
        };
        let records_per_call = usize::try_from(s.records_per_call)
            .ok()
            .filter(|n| (1..=max).contains(n))
            .ok_or_else(|| Invalid {
                field: "records_per_call",
                reason: format!(
                    "records_per_call {} is outside 1..={max} ({why})",
                    s.records_per_call
                ),
            })?;
        let bulk = records_per_call > 1;
        if job.is_some() && !bulk {
            return Err(Invalid {
                field: "records_per_call",
                reason: "a job rule submits its records in bulk: records_per_call must be above 1"
                    .into(),
            });
        }
        // A job opened before its records are sent names itself in their call's path.
        let opened = job.as_ref().is_some_and(|j| j.open.is_some());
        if opened && !s.path.contains("{id}") {
            return Err(Invalid {
                field: "path",
                reason: "a job with an open call names its {id} in the rule's path".into(),
            });
        }
        let path = match opened {
            true => s.path.replace("{id}", "id"),
            false => s.path.to_owned(),
        };
        let request = RequestShape::parse(s.request, &path, bulk)?;
        if request.group.is_some() && job.is_some() {
            return Err(Invalid {
                field: "request",
                reason: "request: group sends its calls itself, and a job rule submits its \
                         records in bulk: give one or the other"
                    .into(),
            });
        }
        let (answer, refusals) = match s.answer {
            None => (None, Vec::new()),
            Some(a) => answer::parse_rule(a)?,
        };
        Ok(Self {
            writer,
            records_per_call,
            request,
            answer,
            refusals,
            job,
        })
    }

    /// Whether its calls take the bulk form (several records per call), even when one
    /// carries a single record.
    pub fn bulk(&self) -> bool {
        self.records_per_call > 1
    }

    /// Whether `r` can be sent as the rule's requests shape it; one that cannot is refused
    /// alone before any call.
    pub fn sendable(&self, r: &Outgoing<'_>) -> bool {
        let record = crate::writer::template::Record {
            delivery_id: r.delivery_id,
            record_key: r.record_key,
            payload: r.payload,
        };
        let item = self.request.item(record);
        item.is_ok_and(|i| self.request.sendable(&i).is_ok())
    }

    /// Puts a batch's records (`n`, each given by `record`) into calls of at most
    /// `records_per_call` each, as indexes; every record is in exactly one call. In order,
    /// or, for a rule that groups its records ([`crate::writer::group`]), by their key.
    pub fn calls<'a>(
        &self,
        n: usize,
        record: impl Fn(usize) -> crate::writer::template::Record<'a>,
    ) -> Vec<Vec<usize>> {
        let per_call = self.records_per_call.max(1);
        match &self.request.group {
            Some(_) => {
                crate::writer::group::calls(n, record, |r| self.request.group_key(r), per_call)
            }
            None => (0..n)
                .collect::<Vec<_>>()
                .chunks(per_call)
                .map(<[usize]>::to_vec)
                .collect(),
        }
    }

    /// A call of `records` as the profile shapes it: of a rule that groups its records,
    /// several records are a group's call, and one alone goes as the rule's own shape
    /// sends one.
    pub fn call<'a>(&'a self, records: &'a [Outgoing<'a>]) -> Call<'a> {
        let bulk = match self.request.group {
            Some(_) => records.len() > 1,
            None => self.bulk(),
        };
        Call {
            records,
            bulk,
            answer: self.answer.as_ref(),
            request: Some(&self.request),
            delete: false,
        }
    }

    /// Whether the rule states how its target deletes a record (`request.delete`).
    pub fn deletes(&self) -> bool {
        self.request.delete.is_some()
    }

    /// The call deleting `record` as the rule's `request.delete` says: one record, alone.
    pub fn delete_call<'a>(&'a self, record: &'a [Outgoing<'a>]) -> Call<'a> {
        Call {
            records: record,
            bulk: false,
            answer: None,
            request: Some(&self.request),
            delete: true,
        }
    }
}

/// Refuses a path holding a line break, a tab or another control character: the URL parser
/// would drop some of them quietly, so what was saved would not be what is called. The error never repeats the path.
fn check_path(path: &str) -> Result<(), String> {
    if path.contains(['\r', '\n']) {
        return Err(
            "path holds a line break (control characters are refused, never dropped)".into(),
        );
    }
    if path.chars().any(char::is_control) {
        return Err(
            "path holds a control character such as a tab (control characters are refused, \
             never dropped; percent-encode what the path needs)"
                .into(),
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn stored<'a>(writer: &'a str, path: &'a str, per_call: i32) -> Stored<'a> {
        Stored {
            writer,
            path,
            records_per_call: per_call,
            request: None,
            answer: None,
            job: None,
        }
    }

    #[test]
    fn each_refusal_names_its_field() {
        let request = json!({"method": "GET"});
        let answer = json!({"kind": "telepathic"});
        for (s, field, words) in [
            (stored("ftp", "x", 1), "writer", "not one of http_json"),
            (stored("usercom", "x", 1), "writer", "preset usercom"),
            (stored("http_json", "a\tb", 1), "path", "control character"),
            (
                stored("http_json", "x", 0),
                "records_per_call",
                "outside 1..=",
            ),
            (
                stored("http_json", "x", 1001),
                "records_per_call",
                "1..=1000",
            ),
            (
                Stored {
                    request: Some(&request),
                    ..stored("http_json", "x", 1)
                },
                "request",
                "GET",
            ),
            (
                Stored {
                    answer: Some(&answer),
                    ..stored("http_json", "x", 10)
                },
                "answer",
                "telepathic",
            ),
        ] {
            let e = RuleProfile::parse(s).unwrap_err();
            assert_eq!(e.field, field, "{s:?}: {e}");
            assert!(e.to_string().contains(words), "{s:?}: {e}");
        }
    }

    #[test]
    fn a_profile_is_typed_once_and_shapes_its_calls() {
        let request = json!({"method": "PUT", "body": {"contacts": "{{records}}"}});
        let answer = json!({"kind": "indexed", "errors": "/errors", "index": "/i"});
        let p = RuleProfile::parse(Stored {
            request: Some(&request),
            answer: Some(&answer),
            ..stored("http_json", "contacts/batch", 100)
        })
        .unwrap();
        assert_eq!(
            (p.writer, p.records_per_call, p.bulk()),
            (WriterKind::HttpJson, 100, true)
        );
        assert_eq!(p.request.method(), reqwest::Method::PUT);
        assert_eq!(p.request.body(vec![json!(1)]), json!({"contacts": [1]}));
        let payload = json!({});
        let records = [Outgoing {
            delivery_id: 1,
            record_key: "k",
            path: "contacts/batch",
            payload: &payload,
        }];
        let call = p.call(&records);
        assert!(call.bulk && call.answer.is_some() && call.request.is_some());
        let plain = RuleProfile::parse(stored("http_json", "users/", 1)).unwrap();
        assert_eq!(plain.request, RequestShape::default());
        assert!(!plain.bulk());
    }
}
