//! Runs every `sql-tests/*.slt` file against its own `eddy` process, over the wire.
//! `cargo test --test slt -- NAME` runs the files whose name contains NAME.

use std::path::{Path, PathBuf};

use libtest_mimic::{Arguments, Failed, Trial};

fn main() {
    let args = Arguments::from_args();
    let binary = PathBuf::from(env!("CARGO_BIN_EXE_eddy"));
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../sql-tests");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&root)
        .expect("sql-tests/ exists")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "slt"))
        .collect();
    files.sort();
    let trials = files
        .into_iter()
        .map(|file| {
            let name = file.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
            let binary = binary.clone();
            Trial::test(name, move || {
                let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
                runtime.block_on(eddy_testkit::run_slt_file(&binary, &file)).map_err(|e| Failed::from(format!("{e:#}")))
            })
        })
        .collect();
    libtest_mimic::run(&args, trials).exit();
}
