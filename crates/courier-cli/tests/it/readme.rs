//! The documentation cannot drift from the binary: every code block of README.md, of every
//! page in docs/ and of crates/courier-target/README.md is either run here against a fresh
//! database (each `courier` command through the real binary, each SQL snippet through
//! PostgreSQL) or checked as far as it can be without running it, with the reason. A block
//! this test does not know fails it, so a new example must come with its check. The
//! configuration page, `.env.example` and `courier::config::KNOWN_VARIABLES` are held to
//! one another as well, and every link between the documents must lead somewhere.

use std::{
    collections::BTreeSet,
    io::Write,
    path::{Path, PathBuf},
    process::Stdio,
    time::Duration,
};

use crate::common::*;

/// The repository's root, where the documentation lives.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The documents whose blocks are checked, in the order their SQL runs: the README, every
/// page of docs/ by name (the catalog first, then deliveries, then the queries that read
/// them), the local target's manual.
fn documents() -> Vec<String> {
    let mut pages: Vec<String> = std::fs::read_dir(root().join("docs"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".md"))
        .map(|name| format!("docs/{name}"))
        .collect();
    pages.sort();
    let mut all = vec!["README.md".to_owned()];
    all.extend(pages);
    all.push("crates/courier-target/README.md".to_owned());
    all
}

/// A fenced code block: its language, its text, where it starts (document and line).
struct Block {
    lang: String,
    text: String,
    at: String,
}

fn blocks(document: &str) -> Vec<Block> {
    let text = std::fs::read_to_string(root().join(document)).unwrap();
    let mut out = Vec::new();
    let mut open: Option<Block> = None;
    for (i, line) in text.lines().enumerate() {
        if let Some(fence) = line.trim_start().strip_prefix("```") {
            match open.take() {
                Some(block) => out.push(block),
                None => {
                    open = Some(Block {
                        lang: fence.trim().to_owned(),
                        text: String::new(),
                        at: format!("{document} line {}", i + 1),
                    })
                }
            }
        } else if let Some(block) = open.as_mut() {
            block.text.push_str(line);
            block.text.push('\n');
        }
    }
    assert!(open.is_none(), "{document}: a code block is never closed");
    out
}

/// The commands of a shell block: continuations joined, comments and blank lines dropped.
fn commands(text: &str) -> Vec<String> {
    let joined = text.replace("\\\n", " ");
    joined
        .lines()
        .map(|l| match l.find("  #").or_else(|| l.find(" # ")) {
            Some(i) => &l[..i],
            None => l,
        })
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_owned)
        .collect()
}

/// Splits a command line into words, honouring single quotes (all the documents use).
fn words(command: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut word = String::new();
    let mut quoted = false;
    for ch in command.chars() {
        match ch {
            '\'' => quoted = !quoted,
            ' ' if !quoted => {
                if !word.is_empty() {
                    out.push(std::mem::take(&mut word));
                }
            }
            _ => word.push(ch),
        }
    }
    if !word.is_empty() {
        out.push(word);
    }
    out
}

/// Runs one `courier ...` command line (with `< file` as stdin) and asserts it succeeds.
fn run_courier(url: &str, command: &str, stdin: Option<&str>) -> String {
    let (command, input) = match command.split_once(" < ") {
        Some((c, _file)) => (c, stdin),
        None => (command, None),
    };
    let args = words(command);
    assert_eq!(args[0], "courier", "{command}");
    let mut child = courier_on(url)
        .args(&args[1..])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut pipe = child.stdin.take().unwrap();
    if let Some(input) = input {
        pipe.write_all(input.as_bytes()).unwrap();
    }
    drop(pipe);
    let out = child.wait_with_output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "documented command `{command}` failed:\n{text}"
    );
    text
}

/// A fresh, migrated database.
async fn migrated() -> TestDb {
    TestDb::new().await
}

#[tokio::test]
async fn every_documented_example_runs_as_written() {
    // The SQL catalog is where the later SQL and enqueue examples run (they name its rule).
    let sql_db = migrated().await;
    let mut covered = 0;
    for block in documents().iter().flat_map(|d| blocks(d)) {
        let first = block.text.trim_start();
        let at = block.at.as_str();
        match block.lang.as_str() {
            "sh" if first.starts_with("cargo run") || first.starts_with("cargo test") => {
                // The quick start and the demo's options: `cargo test` is what runs this
                // test, and CI runs the demo's smoke form (bench_smoke); the full demo takes
                // a minute. What can be checked is that the binary takes what is written.
                for command in commands(&block.text) {
                    cargo_command_is_known(&command, at);
                }
            }
            "sh" if first.starts_with("cargo install") => {
                // Installing: building the release binary takes minutes; the paths it
                // names must hold the `courier` binary.
                for command in commands(&block.text) {
                    cargo_command_is_known(&command, at);
                }
            }
            "sh" if first.starts_with("courier db create") => {
                // A database that does not exist yet: create, migrate, run the worker.
                let name = format!("courier_test_{:016x}", rand::random::<u64>());
                let _drop = DropDatabase::new(&name);
                let url = database_url(&name);
                for command in commands(&block.text) {
                    if command == "courier worker" {
                        worker_runs_and_stops(&url).await;
                    } else {
                        run_courier(&url, &command, None);
                    }
                }
            }
            "sh" if first.starts_with("courier connection add") => {
                let db = migrated().await;
                for command in commands(&block.text) {
                    run_courier(&db.url, &command, None);
                }
            }
            "sh" if first.starts_with("courier enqueue") => {
                // The comment under it shows a line's shape; `{...}` stands for a payload.
                let example = block
                    .text
                    .lines()
                    .find_map(|l| l.trim().strip_prefix("# "))
                    .expect("an example NDJSON line")
                    .replace("{...}", r#"{"email": "ann@example.com"}"#);
                for command in commands(&block.text) {
                    run_courier(&sql_db.url, &command, Some(&format!("{example}\n")));
                }
                let n: i64 = sqlx::query_scalar(
                    "SELECT count(*) FROM deliveries WHERE record_key = 'customer:1'",
                )
                .fetch_one(&sql_db.pool)
                .await
                .unwrap();
                assert_eq!(n, 1, "{at}");
            }
            "sh" if first.starts_with("courier rule pause") => {
                // Operating: on the SQL catalog, after its deliveries were enqueued.
                let out: Vec<String> = commands(&block.text)
                    .iter()
                    .map(|c| run_courier(&sql_db.url, c, None))
                    .collect();
                assert_eq!(out[0], "rule customers: active → paused\n", "{at}");
                assert!(out.last().unwrap().contains("enqueued"), "{at}: {out:?}");
                let paused: bool = sqlx::query_scalar(
                    "SELECT paused OR (SELECT paused FROM connections WHERE name = 'shop-crm')
                     FROM rules WHERE name = 'customers'",
                )
                .fetch_one(&sql_db.pool)
                .await
                .unwrap();
                assert!(!paused, "{at}: the block ends with both resumed");
            }
            "sh" if first.starts_with("courier erase") => {
                // On the SQL catalog: the erasure's id, and what each connection's target
                // will be told.
                for command in commands(&block.text) {
                    let out = run_courier(&sql_db.url, &command, None);
                    assert!(out.starts_with("erasure "), "{at}: {out}");
                    assert!(out.contains("shop-crm"), "{at}: {out}");
                }
            }
            "sh" if first.starts_with("courier target") => {
                target_answers(&commands(&block.text)).await;
            }
            "json" if first.starts_with("{\n  \"connections\"") => {
                let db = migrated().await;
                let file = std::env::temp_dir().join(format!(
                    "courier-readme-{:016x}.json",
                    rand::random::<u64>()
                ));
                std::fs::write(&file, &block.text).unwrap();
                run_courier(&db.url, &format!("courier apply {}", file.display()), None);
                let _ = std::fs::remove_file(file);
            }
            "json" if first.starts_with("{\"about\"") => {
                // How a preset's target answers, for `courier target`: as it reads them.
                let e: courier_target::emulation::Emulation =
                    serde_json::from_str(&block.text).unwrap_or_else(|e| panic!("{at}: {e}"));
                assert!(!e.endpoints.is_empty() || !e.jobs.is_empty(), "{at}");
            }
            "json" if first.starts_with("{\"identity\"") => {
                // A connection's erase operation, as the catalog reads it.
                let v: serde_json::Value = serde_json::from_str(&block.text).unwrap();
                courier::writer::erase::EraseShape::parse(&v)
                    .unwrap_or_else(|e| panic!("{at}: {e}"));
            }
            "json" if first.starts_with("{\"id\"") => {
                // A rule's `job`, as the catalog reads it.
                let v: serde_json::Value = serde_json::from_str(&block.text).unwrap();
                courier::writer::job::JobShape::parse(&v).unwrap_or_else(|e| panic!("{at}: {e}"));
            }
            "json" if first.starts_with("{\"custom_id\"") => {
                // Payload → request pairs of the User.com preset, not a program:
                // tests/it/usercom.rs sends each through the preset and checks the request.
            }
            "json" if first.starts_with("{\"group\"") => {
                // A rule's request that groups records by a value, as the catalog reads it.
                let v: serde_json::Value = serde_json::from_str(&block.text).unwrap();
                let path = "users-by-id/{payload/custom_id}/set_multiple_attributes/";
                let shape = courier::writer::request::RequestShape::parse(Some(&v), path, true)
                    .unwrap_or_else(|e| panic!("{at}: {e}"));
                let consent = serde_json::json!({"custom_id": "c1",
                                                 "attributes": {"email_consent": false}});
                let record = courier::writer::template::Record {
                    delivery_id: 1,
                    record_key: "k",
                    payload: &consent,
                };
                assert_eq!(
                    shape.group_key(record),
                    Some(serde_json::json!({"name": "email_consent", "value": false})),
                    "{at}"
                );
            }
            "json" if first.starts_with("{\"delete\"") => {
                // A rule's request stating how its target deletes a record, as the catalog
                // reads it.
                let v: serde_json::Value = serde_json::from_str(&block.text).unwrap();
                let shape =
                    courier::writer::request::RequestShape::parse(Some(&v), "contacts", false)
                        .unwrap_or_else(|e| panic!("{at}: {e}"));
                assert!(shape.delete.is_some(), "{at}");
            }
            "rust" => {
                // The library API (enqueue, enqueue_many, NewDelivery) as the engine's own
                // tests call it on every run.
            }
            "sql" => {
                // Catalog first, then deliveries, then the inspection queries: each runs
                // against the same database, in the documents' order.
                sqlx::raw_sql(sqlx::AssertSqlSafe(block.text.clone()))
                    .execute(&sql_db.pool)
                    .await
                    .unwrap_or_else(|e| panic!("{at}: {e}"));
            }
            _ => panic!("{at}: a {:?} block this test does not cover", block.lang),
        }
        covered += 1;
    }
    assert!(covered >= 18, "only {covered} blocks found");
}

/// A documented `cargo` command: `cargo test`, `cargo build --release`, `cargo install
/// --path crates/courier-cli`, or `cargo run --release -- SUBCOMMAND --flag ...`, whose
/// subcommand and flags the binary must take (its `--help` lists each flag).
fn cargo_command_is_known(command: &str, at: &str) {
    let args = words(command);
    match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        ["cargo", "test"] | ["cargo", "build", "--release"] => {}
        ["cargo", "install", "--path", path] => {
            let manifest = std::fs::read_to_string(root().join(path).join("Cargo.toml"))
                .unwrap_or_else(|e| panic!("{at}: {path}: {e}"));
            assert!(
                manifest.contains("[[bin]]\nname = \"courier\""),
                "{at}: {path} builds no `courier` binary"
            );
        }
        ["cargo", "run", "--release", "--", subcommand, rest @ ..] => {
            let out = courier().args([subcommand, "--help"]).output().unwrap();
            let help = String::from_utf8_lossy(&out.stdout);
            assert!(out.status.success(), "{at}: `courier {subcommand}`: {help}");
            for flag in rest.iter().filter(|w| w.starts_with("--")) {
                assert!(
                    help.contains(&format!("{flag} ")),
                    "{at}: `courier {subcommand}` takes no {flag}:\n{help}"
                );
            }
        }
        _ => panic!("{at}: a cargo command this test does not know: {command}"),
    }
}

/// `courier worker` starts, and stops with status 0 on SIGTERM.
async fn worker_runs_and_stops(url: &str) {
    let child = courier_on(url)
        .arg("worker")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "courier worker: {err}");
    assert!(err.contains("worker started"), "{err}");
}

/// `courier target` as its manual starts it (on a free port instead of 8080), then the
/// counters the manual reads with curl.
async fn target_answers(commands: &[String]) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let start = &commands[0];
    let args = words(&start.replace("--port 8080", &format!("--port {port}")));
    let mut child = courier()
        .args(&args[1..])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    assert!(commands[1].starts_with("curl -s localhost:8080/_counters"));
    let mut body = None;
    for _ in 0..100 {
        if let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) {
            use std::io::Read;
            s.write_all(b"GET /_counters HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
                .unwrap();
            let mut text = String::new();
            let _ = s.read_to_string(&mut text);
            body = Some(text);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = child.kill();
    let _ = child.wait();
    let body = body.expect("courier target answers");
    assert!(body.starts_with("HTTP/1.1 200"), "{body}");
}

/// A setting's default as a document states it: `None` for unset.
type Defaults = std::collections::BTreeMap<String, Option<String>>;

/// The rows `| `NAME` | default | meaning |` of the table under `heading` in a page; a
/// default is `` `value` `` or `unset`.
fn table_rows(page: &str, heading: &str) -> Defaults {
    let section = page
        .split_once(&format!("\n{heading}\n"))
        .unwrap_or_else(|| panic!("no {heading} in the page"))
        .1;
    let section = section.split("\n## ").next().unwrap();
    let mut rows = Defaults::new();
    for line in section.lines().filter(|l| l.starts_with("| `")) {
        let cells: Vec<&str> = line.split(" | ").map(str::trim).collect();
        let name = cells[0]
            .trim_start_matches("| ")
            .trim_matches('`')
            .to_owned();
        let default = match cells.get(1).copied() {
            // The tooling table has no default column.
            _ if heading == "## Read by the tooling" => None,
            Some("unset") => None,
            Some(v) if v.starts_with('`') && v.ends_with('`') && v.len() > 2 => {
                Some(v.trim_matches('`').to_owned())
            }
            other => panic!("{name}: a default must be `value` or unset, not {other:?}"),
        };
        assert!(rows.insert(name.clone(), default).is_none(), "{name} twice");
    }
    rows
}

/// `.env.example`'s variables: `NAME=value` is a default, `NAME=` and a commented
/// `# NAME=example` are unset.
fn env_example(text: &str) -> Defaults {
    let mut vars = Defaults::new();
    for line in text.lines() {
        let (commented, line) = match line.strip_prefix("# ") {
            Some(rest) => (true, rest),
            None => (false, line),
        };
        let Some((name, value)) = line.split_once('=') else {
            continue;
        };
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_uppercase() || c == '_') {
            continue;
        }
        let default = (!commented && !value.is_empty()).then(|| value.to_owned());
        assert!(
            vars.insert(name.to_owned(), default).is_none(),
            "{name} twice"
        );
    }
    vars
}

#[test]
fn configuration_page_env_example_and_known_variables_agree() {
    let page = std::fs::read_to_string(root().join("docs/configuration.md")).unwrap();
    let example = std::fs::read_to_string(root().join(".env.example")).unwrap();
    let documented = table_rows(&page, "## Settings");
    let listed = env_example(&example);
    let names = |d: &Defaults| d.keys().cloned().collect::<BTreeSet<_>>();
    let known: BTreeSet<String> = courier::config::KNOWN_VARIABLES
        .iter()
        .map(|n| n.to_string())
        .collect();
    assert_eq!(
        names(&documented),
        known,
        "docs/configuration.md vs KNOWN_VARIABLES"
    );
    assert_eq!(names(&listed), known, ".env.example vs KNOWN_VARIABLES");
    assert_eq!(
        documented, listed,
        "defaults: docs/configuration.md vs .env.example"
    );
    // Each default stated is the one courier uses when the variable is unset.
    let unset = courier::config::Settings::from_lookup(|_| None).unwrap();
    for (name, default) in &documented {
        let Some(value) = default else { continue };
        let set = courier::config::Settings::from_lookup(|n| (n == name).then(|| value.clone()))
            .unwrap_or_else(|e| panic!("{name}={value}: {e:?}"));
        assert_eq!(
            format!("{set:?}"),
            format!("{unset:?}"),
            "{name}={value} is not courier's default"
        );
    }
    let tooling: BTreeSet<String> = courier::config::TOOLING_VARIABLES
        .iter()
        .map(|n| n.to_string())
        .collect();
    assert_eq!(
        names(&table_rows(&page, "## Read by the tooling")),
        tooling,
        "docs/configuration.md vs TOOLING_VARIABLES"
    );
}

/// GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of a Markdown file's headings (outside code blocks).
fn anchors(text: &str) -> BTreeSet<String> {
    let mut fenced = false;
    let mut out = BTreeSet::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if !fenced && line.starts_with('#') {
            out.insert(anchor(line.trim_start_matches('#')));
        }
    }
    out
}

#[test]
fn every_link_between_the_documents_resolves() {
    let mut documents = documents();
    documents.extend(["BENCHMARKS.md".to_owned(), "ARCHITECTURE.md".to_owned()]);
    let mut checked = 0;
    for document in &documents {
        let text = std::fs::read_to_string(root().join(document)).unwrap();
        let dir = Path::new(document).parent().unwrap().to_owned();
        for (i, line) in text.lines().enumerate() {
            for link in line.split("](").skip(1) {
                let Some(target) = link.split(')').next() else {
                    continue;
                };
                if target.contains("://") || target.starts_with("mailto:") {
                    continue;
                }
                let (path, fragment) = match target.split_once('#') {
                    Some((p, f)) => (p, Some(f)),
                    None => (target, None),
                };
                let file = if path.is_empty() {
                    Path::new(document).to_owned()
                } else {
                    dir.join(path)
                };
                let at = format!("{document} line {}: {target}", i + 1);
                let full = root().join(&file);
                assert!(full.exists(), "{at}: no such file");
                if let Some(fragment) = fragment {
                    let linked = std::fs::read_to_string(&full).unwrap();
                    assert!(anchors(&linked).contains(fragment), "{at}: no such heading");
                }
                checked += 1;
            }
        }
    }
    assert!(checked >= 40, "only {checked} links found");
}
