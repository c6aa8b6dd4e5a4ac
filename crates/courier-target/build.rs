// How each target answers a batch call is data: the sink's own styles (`styles.json`) and,
// beside each preset of the engine, `presets/<name>.target.json`. Every such file is built
// in (`emulation::EMULATIONS`): a new vendor's emulation is a file, nothing else.
use std::{env, fs, path::Path};

fn main() {
    let root = Path::new(&env::var("CARGO_MANIFEST_DIR").unwrap()).to_path_buf();
    let presets = root.join("../../presets");
    println!("cargo:rerun-if-changed=styles.json");
    println!("cargo:rerun-if-changed={}", presets.display());
    let mut files: Vec<(String, std::path::PathBuf)> = fs::read_dir(&presets)
        .expect("presets/")
        .filter_map(|e| {
            let path = e.ok()?.path();
            let name = path
                .file_name()?
                .to_str()?
                .strip_suffix(".target.json")?
                .to_owned();
            Some((name, path))
        })
        .collect();
    files.sort();
    files.insert(0, ("styles".into(), root.join("styles.json")));
    let entries: String = files
        .iter()
        .map(|(name, path)| {
            let path = path.canonicalize().expect("emulation file");
            format!(
                "    ({name:?}, include_str!({:?})),\n",
                path.display().to_string()
            )
        })
        .collect();
    let out = Path::new(&env::var("OUT_DIR").unwrap()).join("emulations.rs");
    fs::write(out, format!("&[\n{entries}]")).unwrap();
}
