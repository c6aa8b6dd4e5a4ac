// `sqlx::migrate!` embeds migrations/ at compile time: a new or changed migration must
// rebuild the crate, or a binary would miss it. Every `presets/<name>.json` is a preset
// (`courier::presets::PRESETS`): a new one is a file, nothing else; `<name>.target.json`
// beside it says how its target answers, for `courier target`.
use std::{env, fs, path::Path};

fn main() {
    println!("cargo:rerun-if-changed=migrations");
    println!("cargo:rerun-if-changed=presets");
    let dir = Path::new(&env::var("CARGO_MANIFEST_DIR").unwrap()).join("presets");
    let mut names: Vec<String> = fs::read_dir(&dir)
        .expect("presets/")
        .filter_map(|e| {
            let name = e.ok()?.file_name().into_string().ok()?;
            // `<name>.target.json` beside a preset is how its target answers, for
            // `courier target` (crates/courier-target), not a preset.
            let name = name.strip_suffix(".json")?;
            (!name.ends_with(".target")).then(|| name.to_owned())
        })
        .collect();
    names.sort();
    let entries: String = names
        .iter()
        .map(|n| {
            let path = dir.join(format!("{n}.json"));
            format!(
                "    preset({n:?}, include_str!({:?})),\n",
                path.display().to_string()
            )
        })
        .collect();
    let out = Path::new(&env::var("OUT_DIR").unwrap()).join("presets.rs");
    fs::write(out, format!("&[\n{entries}]")).unwrap();
}
