//! The emulation files: how each target answers, as data. The sink's own styles
//! (`crates/courier-target/styles.json`) and, beside each preset of the engine,
//! `presets/<name>.target.json`, built in ([`EMULATIONS`]) and parsed once. A file lists
//! batch endpoints (answered by [`crate::vendors`]), asynchronous jobs (run by
//! [`crate::jobs`]) and the rate-limit headers the target states (by
//! [`crate::limiter::rate_headers`], for a workspace set to the file's name).

use std::{collections::BTreeMap, sync::LazyLock};

use serde::Deserialize;
use serde_json::{Map, Value};

/// Every emulation built in, by name (`styles`, then each preset's), as JSON text.
pub const EMULATIONS: &[(&str, &str)] = include!(concat!(env!("OUT_DIR"), "/emulations.rs"));

/// How one target answers: its batch endpoints.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Emulation {
    /// What the file emulates, and from which of the vendor's documents.
    pub about: String,
    /// Its batch endpoints, tried in order.
    #[serde(default)]
    pub endpoints: Vec<Endpoint>,
    /// Its asynchronous jobs ([`crate::jobs`]).
    #[serde(default)]
    pub jobs: Vec<JobEmulation>,
    /// The rate-limit headers the vendor states what is left in, if it has its own.
    #[serde(default)]
    pub rate_headers: Option<RateHeaderNames>,
    /// The API a workspace serves, if the vendor's API is one per workspace
    /// ([`crate::operations`]).
    #[serde(default)]
    pub workspace: Option<WorkspaceApi>,
    /// How the vendor erases a person, and finds the id it erases them by
    /// ([`crate::erase`]): calls on the people its endpoints keep.
    #[serde(default)]
    pub erase: Vec<EraseCall>,
}

/// One call of a vendor's that erases people from a store its endpoints keep, or finds
/// them there (a lookup of the id the vendor deletes by). Its templates are the batch
/// sink's ([`crate::vendors`]), the call's people as its records: `{{count}}` how many it
/// removed or found, `$each: accepted` each of them (`{{item/...}}` the record kept for
/// them, `{{contact_id}}` the id the target gave them).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EraseCall {
    /// Where the vendor describes the call: its spec's operation or its reference page.
    pub source: String,
    /// Its method.
    pub method: String,
    /// Its path: segments, `*` one, `**` any number, `{name}` one naming the person
    /// (percent-decoded).
    pub path: String,
    /// Where a call's erasures are, when it carries several (a JSON pointer to a list; each
    /// item names one person); absent: the body is the one.
    #[serde(default)]
    pub records: Option<String>,
    /// Fields every erasure must hold (pointer into it → value) for the call to be this
    /// one: a vendor that erases through the endpoint it upserts through (an item's
    /// `action`); a call that does not hold them goes to the endpoint.
    #[serde(default)]
    pub when: Map<String, Value>,
    /// The store of the people it erases (an endpoint's `contacts.store`).
    pub store: String,
    /// How a call names a person: the first of these the call holds.
    pub names: Vec<Name>,
    /// What it does with the people it names.
    #[serde(default)]
    pub action: EraseAction,
    /// Whether the vendor remembers the people it erased and refuses to take them again
    /// (where an endpoint's `contacts.forgotten` says how).
    #[serde(default)]
    pub forget: bool,
    /// Its answer when it removed or found someone.
    pub ok: Answer,
    /// Its answer when it knew nobody the call names (default: `ok`).
    #[serde(default)]
    pub unknown: Option<Answer>,
    /// Its own limits, each `N/s`, `N/min` or `N/h`, every one must admit a call (fixed
    /// windows, a 429 with `Retry-After` in whole seconds when spent).
    #[serde(default)]
    pub limits: Option<CallLimits>,
}

/// Where a call names a person, and what of the people kept it is matched against.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Name {
    /// Where the call holds it: `{name}` (the path's segment), `?<parameter>` (a query
    /// parameter, form-decoded), or a JSON pointer into the erasure (a string, or a list of
    /// strings each naming one person).
    pub from: String,
    /// The text it stands in, `{}` for the name (a query language's statement:
    /// `SELECT Id FROM Contact WHERE Email = '{}'`); absent: the whole value.
    #[serde(default)]
    pub pattern: Option<String>,
    /// What it names a kept person by: `key` (the store's key), `id` (the id the target
    /// gave them, written as `id`), or a JSON pointer into the record kept for them;
    /// matched whatever its case.
    pub matches: String,
    /// For `matches: id`: how the vendor writes the id (`003{{contact_id}}`); default
    /// `{{contact_id}}`.
    #[serde(default)]
    pub id: Option<String>,
    /// A hash the call names the person by, of the matched value in lower case.
    #[serde(default)]
    pub hash: Option<NameHash>,
}

/// A hash of a person's name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NameHash {
    /// MD5, in lower-case hex.
    Md5,
}

/// What an erase call does with the people it names.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EraseAction {
    /// Removes them from the store.
    #[default]
    Remove,
    /// Finds them, removing nothing (a lookup).
    Find,
}

/// What a workspace serves under its prefix: its stores, its logs and the operations on
/// them, each as the vendor's reference describes it.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkspaceApi {
    /// Where the vendor describes its API as a whole (base URL, errors).
    pub source: String,
    /// The path of the API inside a workspace (`api/public/`).
    pub prefix: String,
    /// Records kept by key, by the store's name.
    pub stores: BTreeMap<String, Store>,
    /// Entries appended in arrival order, by the log's name.
    #[serde(default)]
    pub logs: Vec<String>,
    /// Its error answers.
    pub errors: Errors,
    /// Its operations, tried in order.
    pub operations: Vec<Operation>,
}

/// A store of records, each an object under its key.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Store {
    /// The field holding a record's key (written by the target).
    pub key: String,
    /// A field holding a number the target gives each new record (one sequence for all
    /// the workspace's stores), kept whatever a call writes.
    #[serde(default)]
    pub id: Option<String>,
    /// Fields a record has without the workspace declaring them; the workspace's
    /// declared fields ([`crate::WorkspaceConfig::custom_attributes`]) are the others.
    #[serde(default)]
    pub standard: Vec<String>,
}

/// How a workspace's API answers an error. Templates take `{{field}}`, `{{message}}` and
/// `{{method}}`, in keys as in values.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Errors {
    /// A call without the workspace's token (`Authorization: Token <token>`).
    pub missing_token: Answer,
    /// A call with another token, or another scheme.
    pub invalid_token: Answer,
    /// A call past the workspace's limit (`{{seconds}}` the wait in whole seconds,
    /// rounded up; `{{plural_s}}` an `s` unless it is 1).
    pub throttled: Answer,
    /// A body that is not JSON.
    pub not_json: Answer,
    /// A field refused: its answer.
    pub field: Answer,
    /// A record or path it does not have.
    pub not_found: Answer,
    /// A path it serves, called with another method.
    pub method: Answer,
    /// The message of a required field missing.
    pub required: String,
    /// A body that is not an object: the field and message it is refused with.
    pub not_object: (String, String),
}

/// One operation of a workspace's API.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Operation {
    /// Where the vendor describes it.
    pub source: String,
    /// Its method.
    pub method: String,
    /// Its path under the prefix: segments, `{key}` one taken as a record's key
    /// (percent-decoded); a trailing slash or none.
    pub path: String,
    /// What the call must satisfy, checked in order; the first broken answers.
    #[serde(default)]
    pub checks: Vec<Check>,
    /// What it does.
    pub action: Action,
    /// Its answer (templates: `{{key}}`, `{{id}}`, `{{created}}`, `{{updated_count}}`,
    /// `{{not_found}}`).
    pub ok: Answer,
    /// The target's own key for each record it writes, counted per key to find
    /// duplicates (not the vendor's: `{{key}}`, `{{attribute}}`, `{{delivery_id}}` the
    /// courier delivery id an appended entry carries in `data`, else `#<position>`).
    pub accepted: String,
}

/// A condition on a call; field names are the body's top-level fields.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Check {
    /// The body is an object.
    Object,
    /// A field is present, of this kind.
    Required {
        /// The field.
        field: String,
        /// What it must hold.
        kind: Kind,
    },
    /// String fields hold at most `max` characters.
    MaxChars {
        /// The fields.
        fields: Vec<String>,
        /// The most characters.
        max: usize,
        /// The message (`{{max}}`).
        message: String,
    },
    /// A list field holds at most `max` items.
    MaxItems {
        /// The field.
        field: String,
        /// The most items.
        max: usize,
        /// The message (`{{max}}`).
        message: String,
    },
    /// A string field holds one of these values.
    OneOf {
        /// The field.
        field: String,
        /// The values allowed.
        values: Vec<String>,
        /// The message (`{{value}}`).
        message: String,
    },
    /// Field names a store's records have: standard or declared by the workspace.
    Declared {
        /// The store.
        store: String,
        /// The names: the body's fields (`""`), or the one a string field holds.
        names: String,
        /// The message (`{{name}}`), refused under that name.
        message: String,
    },
    /// The record of the path's `{key}` exists, else `not_found`.
    Exists {
        /// Its store.
        store: String,
    },
    /// The call names a record of a store, by the first of these fields present.
    Reference {
        /// The store.
        store: String,
        /// The fields that may name it.
        by: Vec<RefField>,
        /// The field named when none is present.
        required: String,
        /// Whether the record must exist.
        must_exist: bool,
    },
}

/// What a required field must hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// A key: a non-empty string or a number.
    Key,
    /// A non-empty string.
    Text,
    /// Any string.
    String,
    /// A list.
    List,
    /// Anything.
    Any,
}

/// A field naming a record.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RefField {
    /// The field.
    pub field: String,
    /// What it holds: the record's key (`key`) or its number (`id`).
    pub by: RefBy,
    /// The message when the record does not exist (`{{value}}`).
    pub unknown: String,
}

/// What a reference holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RefBy {
    /// The record's key.
    Key,
    /// The record's number.
    Id,
}

/// What an operation does.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Action {
    /// Writes the body's fields into a record, created if new.
    Upsert {
        /// The store.
        store: String,
        /// Where its key is: a body field, or `{key}` the path's.
        key: String,
    },
    /// Sets one field to one value in many records; those it does not have are named in
    /// `{{not_found}}` (as given).
    SetMany {
        /// The store.
        store: String,
        /// The list field naming the records.
        ids: String,
        /// What they are named by.
        by: RefBy,
        /// The field naming the field to set.
        attribute: String,
        /// The field holding the value.
        value: String,
    },
    /// Removes the record of the path's `{key}` from a store (check `exists` first to
    /// answer a key it does not have).
    Delete {
        /// The store.
        store: String,
    },
    /// Appends the body to a log, with `add` fields (templates, `{{key}}` the path's).
    Append {
        /// The log.
        log: String,
        /// Fields added to the entry.
        #[serde(default)]
        add: Map<String, Value>,
        /// A store whose record of the path's `{key}` takes the fields of this object
        /// field of the body (created if new; courier's delivery id left out).
        #[serde(default)]
        merge: Option<(String, String)>,
    },
}

/// Rate-limit headers of three fields: the limit, what is left, and when it resets or how
/// long the window is. Names are matched in lower case, as HTTP/2 sends them.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateHeaderNames {
    /// Where the vendor documents them.
    pub source: String,
    /// The header stating the requests allowed per window.
    pub limit: String,
    /// The header stating the requests left in it.
    pub remaining: String,
    /// The header stating when the budget is back, if the vendor sends one.
    #[serde(default)]
    pub reset: Option<Timed>,
    /// The header stating the window's length, if the vendor sends one.
    #[serde(default)]
    pub window: Option<Timed>,
}

/// A header stating a time.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Timed {
    /// Its name.
    pub header: String,
    /// How it states the time.
    pub unit: TimeUnit,
}

/// How a header states a time: a span (a reset from now, or a window) in whole seconds or
/// milliseconds, rounded up, or a moment as a UTC epoch second (rounded up).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TimeUnit {
    /// Whole seconds.
    Seconds,
    /// Whole milliseconds.
    Milliseconds,
    /// The UTC epoch second of the moment (a reset only).
    EpochSeconds,
}

/// One batch endpoint.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Endpoint {
    /// Where the vendor writes what this endpoint does: its spec (file and operation) or
    /// its reference page.
    pub source: String,
    /// The paths it serves: segments, `*` for one, `**` for any number.
    pub paths: Vec<String>,
    /// Where a call's records are: a JSON pointer to a list of them, or to one record
    /// (`""`: the body is the one record); absent: the body's first list.
    #[serde(default)]
    pub records: Option<String>,
    /// The people it keeps, when it keeps any: a record names one, known to the target
    /// or new.
    #[serde(default)]
    pub contacts: Option<Contacts>,
    /// A field of each record whose values must all be strings (e.g. a CRM's `properties`);
    /// a call breaking it gets `bad_request`.
    #[serde(default)]
    pub strings: Option<String>,
    /// Its answer to a call it refuses as malformed (default: 400 naming the field).
    #[serde(default)]
    pub bad_request: Option<Answer>,
    /// Its answer when every record of the call is valid.
    pub ok: Answer,
    /// Its answer when every record is valid and each names a contact the target knew
    /// (an update; default: `ok`).
    #[serde(default)]
    pub updated: Option<Answer>,
    /// Its answer when some record is invalid (default: `ok`).
    #[serde(default)]
    pub partial: Option<Answer>,
}

/// The people an endpoint keeps, in a store named for the vendor.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Contacts {
    /// The store's name (one per vendor).
    pub store: String,
    /// Where a record names its person (a JSON pointer: `/email`), matched whatever its
    /// case.
    pub key: String,
    /// What it does with a person the store does not have.
    pub unknown: Unknown,
    /// Its answer when `unknown` is `refuse` and a record names such a person: the whole
    /// call refused (`{{unknown_indexes}}`: their positions, `3,4`); absent, a 404 naming
    /// them.
    #[serde(default)]
    pub refused: Option<Answer>,
    /// A field of the body that must be `true` for a known person to be updated (e.g.
    /// `updateEnabled`); without it, such a call gets `duplicate`.
    #[serde(default)]
    pub update_flag: Option<String>,
    /// Its answer to a known person without the update flag.
    #[serde(default)]
    pub duplicate: Option<Answer>,
    /// What it does with a person the vendor erased for good ([`EraseCall::forget`]);
    /// absent: takes them again, as anyone new.
    #[serde(default)]
    pub forgotten: Option<Forgotten>,
}

/// How an endpoint refuses a person its vendor erased for good.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Forgotten {
    /// The whole call answered so (an endpoint of one record).
    Call(Answer),
    /// Their record refused, as an invalid one (a batch).
    Record,
}

/// What an endpoint does with a person its target does not have yet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Unknown {
    /// Creates them (an upsert).
    Create,
    /// Refuses the call (an update only).
    Refuse,
}

/// One answer of an endpoint.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Answer {
    /// The HTTP status.
    pub status: u16,
    /// The body template; absent: no body.
    #[serde(default)]
    pub body: Option<Value>,
    /// Which records it accepts.
    #[serde(default)]
    pub accepts: Accepts,
}

/// Which records of a call an answer accepts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Accepts {
    /// The valid ones.
    #[default]
    Valid,
    /// None: the whole call refused.
    None,
    /// All of them.
    All,
}

/// The emulations built in, parsed once; a file that does not parse fails the first call
/// with its name (and the test that reads them all).
static PARSED: LazyLock<Vec<(&'static str, Emulation)>> = LazyLock::new(|| {
    EMULATIONS
        .iter()
        .map(|(name, text)| {
            let e = serde_json::from_str(text).unwrap_or_else(|e| panic!("emulation {name}: {e}"));
            (*name, e)
        })
        .collect()
});

/// The emulations built in, parsed.
pub fn emulations() -> &'static [(&'static str, Emulation)] {
    &PARSED
}

/// The emulation built in under `name`, with the name as it is kept.
pub fn named(name: &str) -> Option<(&'static str, &'static Emulation)> {
    emulations()
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(n, e)| (*n, e))
}

/// How one vendor runs a kind of job: its calls, its states' names, its answers.
/// Templates are those of the batch sink ([`crate::vendors`]), with `{{id}}` (`{{number}}`
/// its number alone), `{{state}}`,
/// `{{count}}`, `{{completed_count}}`, `{{failed_count}}` and `{{processed_count}}` (0
/// until complete), `{{body/<pointer>}}` (the request's body), and in an error
/// `{{code}}` and `{{message}}`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobEmulation {
    /// Where the vendor writes how its jobs run: its spec's operations or its reference
    /// pages.
    pub source: String,
    /// A job's id: this prefix, then its number.
    pub id_prefix: String,
    /// The number's digits, zero-padded (0: as it comes).
    #[serde(default)]
    pub id_digits: usize,
    /// Its states' names.
    pub states: States,
    /// The call that creates a job.
    pub create: Step,
    /// The call that uploads its records, if they are not in the create call.
    #[serde(default)]
    pub upload: Option<Step>,
    /// The call that closes it (the job starts then) or aborts it, if the vendor has one.
    #[serde(default)]
    pub close: Option<Step>,
    /// The call that reads its state (a poll).
    pub status: Step,
    /// The call that lists its failed records.
    pub errors: ErrorsStep,
    /// A field (a JSON pointer into each record) a record fails without.
    #[serde(default)]
    pub required: Option<String>,
    /// The body of an error answer.
    pub error: Value,
    /// The limits of each of its calls, each call limited on its own, when the target is
    /// told to enforce them ([`crate::jobs::JobsConfig::limited`]).
    #[serde(default)]
    pub limits: Option<CallLimits>,
}

/// Limits on each call of a job, fixed windows answered 429 with `Retry-After` in whole
/// seconds when spent.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CallLimits {
    /// Where the vendor states them.
    pub source: String,
    /// Each limit, `N/s`, `N/min` or `N/h`: every one must admit a call.
    pub each_call: Vec<String>,
}

/// A job's states, by the vendor's names.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct States {
    /// Created, not closed yet (where there is a close call).
    #[serde(default)]
    pub open: Option<String>,
    /// Waiting to run; asked for by a close call, it closes the job.
    pub queued: String,
    /// Running.
    pub processing: String,
    /// Done.
    pub complete: String,
    /// Cancelled; asked for by a close call, it aborts the job.
    pub cancelled: String,
}

/// One call of a job.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Step {
    /// Its method.
    pub method: String,
    /// Its path: segments, `**` first for any prefix, `{id}` the job's id.
    pub path: String,
    /// Its answer's status.
    #[serde(default = "ok")]
    pub status: u16,
    /// Its answer's body template; absent: none.
    #[serde(default)]
    pub body: Option<Value>,
    /// Where the request carries the job's records: `{"json": "<pointer>"}` or `"csv"`.
    #[serde(default)]
    pub records: Option<Records>,
    /// Fields the request's body must have (pointer → value, `"*"` any).
    #[serde(default)]
    pub requires: Map<String, Value>,
    /// A close call: where its body names the state asked for.
    #[serde(default)]
    pub state_at: Option<String>,
}

fn ok() -> u16 {
    200
}

/// Where a call carries a job's records.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Records {
    /// A JSON array at this pointer of the body.
    Json(String),
    /// The body, as CSV with a header line.
    Csv,
    /// A multipart form's file part of this name, as CSV with a header line; its other
    /// parts are the body (each by name, JSON where it parses) for `requires` and
    /// `{{body/...}}`.
    Multipart(String),
}

/// The call listing a job's failed records.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ErrorsStep {
    /// Its path, as a [`Step`]'s (method GET).
    pub path: String,
    /// JSON pages of this body template, whose `$each: refused` lists the page's records;
    /// `{{self}}` and `{{next}}` (null on the last page) are the pages' absolute links,
    /// `{{next_cursor}}` the next page's cursor alone, and `{{line}}` a record's line in
    /// the CSV it came in (its header line 1).
    #[serde(default)]
    pub body: Option<Value>,
    /// Its pages' query parameters and sizes; absent: one page.
    #[serde(default)]
    pub page: Option<Page>,
    /// A CSV instead: these columns (each a template per failed record, `{{item/...}}` a
    /// field of it), then the uploaded ones.
    #[serde(default)]
    pub csv: Option<Vec<(String, String)>>,
    /// Served as a file by another host than the API's (a vendor's import reports): at the
    /// other name of loopback (`localhost` for `127.0.0.1`, and back), its URL in the
    /// status answer's `{{report}}` once the job is complete with failed records (null
    /// before, and when none failed).
    #[serde(default)]
    pub file_host: Option<FileHost>,
}

/// A host serving a vendor's files.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileHost {
    /// Headers it refuses a request carrying (400): the API's credentials, which have no
    /// business there.
    pub refuses: Vec<String>,
}

/// How an errors listing pages.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Page {
    /// The query parameter of the page's size.
    pub size_param: String,
    /// The query parameter of the page's cursor (the position of its first record).
    pub cursor_param: String,
    /// The size unless asked.
    pub size: usize,
    /// The largest size.
    pub max: usize,
}
