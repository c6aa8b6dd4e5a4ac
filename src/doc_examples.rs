//! The JSON examples of a file's `//!` documentation, for the tests that hold each example
//! to the parser it shows input for (an example the parser refuses fails CI).

/// Every ```` ```json ```` block of `source`'s `//!` lines, parsed.
pub fn of(source: &str) -> Vec<serde_json::Value> {
    let mut out = Vec::new();
    let mut block: Option<String> = None;
    for line in source.lines().filter_map(|l| l.strip_prefix("//!")) {
        match (line.trim(), &mut block) {
            ("```json", None) => block = Some(String::new()),
            ("```", Some(text)) => {
                let parsed = serde_json::from_str(text);
                out.push(parsed.unwrap_or_else(|e| panic!("a doc example: {e}\n{text}")));
                block = None;
            }
            (_, Some(text)) => text.push_str(line),
            _ => {}
        }
    }
    out
}
