//! Runs every `sql-tests/*.slt` and `sql-tests/regress/*.slt` file against its own `eddy`
//! process, over the wire (`RESTART` and `CRASH` in a file restart it: `eddy_testkit::Connection`).
//! `cargo test --test slt -- NAME` runs the files whose name contains NAME.

use std::path::{Path, PathBuf};

use libtest_mimic::{Arguments, Failed, Trial};

fn main() {
    let args = Arguments::from_args();
    let binary = PathBuf::from(env!("CARGO_BIN_EXE_eddy"));
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../sql-tests");
    let slt_files = |dir: &Path| -> Vec<PathBuf> {
        let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|e| e == "slt"))
            .collect();
        files.sort();
        files
    };
    // Features first, then the regressions (sql-tests/regress/, named after what they protect).
    let files: Vec<(String, PathBuf)> = slt_files(&root)
        .into_iter()
        .map(|f| (String::new(), f))
        .chain(
            slt_files(&root.join("regress"))
                .into_iter()
                .map(|f| ("regress/".to_owned(), f)),
        )
        .collect();
    let trials = files
        .into_iter()
        .map(|(prefix, file)| {
            let name = format!(
                "{prefix}{}",
                file.file_stem()
                    .map(|s| s.to_string_lossy().into_owned())
                    .unwrap_or_default()
            );
            let binary = binary.clone();
            Trial::test(name, move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()?;
                runtime
                    .block_on(eddy_testkit::run_slt_file(&binary, &file))
                    .map_err(|e| Failed::from(format!("{e:#}")))
            })
        })
        .collect();
    libtest_mimic::run(&args, trials).exit();
}
