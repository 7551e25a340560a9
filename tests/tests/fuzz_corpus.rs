//! The fuzz targets' properties over the committed corpus and every past crash: deterministic
//! regression inputs, so CI never depends on a random search (open-ended fuzzing is `cargo xtask
//! fuzz`, outside CI).

use std::{fs, path::Path};

use gateway_common::testing::properties::TARGETS;

/// Runs `check` over every file in `dir`; returns how many it read.
fn replay(dir: &Path, check: fn(&[u8])) -> usize {
    let Ok(entries) = fs::read_dir(dir) else {
        return 0;
    };
    let mut n = 0;
    for entry in entries {
        let path = entry.expect("corpus entry").path();
        let input = fs::read(&path).expect("corpus file");
        if let Err(panic) = std::panic::catch_unwind(|| check(&input)) {
            panic!("{} fails: {panic:?}", path.display());
        }
        n += 1;
    }
    n
}

#[test]
fn every_corpus_input_and_past_crash_keeps_its_property() {
    let fuzz = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    for (target, check) in TARGETS {
        let corpus = replay(&fuzz.join("corpus").join(target), check);
        let crashes = replay(&fuzz.join("regressions").join(target), check);
        eprintln!("{target}: {corpus} corpus inputs, {crashes} past crashes");
        assert!(
            corpus >= 50,
            "{target}: the committed corpus has only {corpus} inputs"
        );
    }
}

#[test]
fn the_split_divergence_found_in_ci_is_a_regression_input() {
    let input = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/regressions/client_hello/split-divergence.bin");
    gateway_common::testing::properties::client_hello(&fs::read(input).expect("regression input"));
}
