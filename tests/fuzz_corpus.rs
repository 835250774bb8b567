//! Replays the committed fuzz corpus and any crash artifacts through the fuzz targets on stable
//! Rust, so every input that ever mattered to the fuzzer is a regression test of `cargo test`.

#[path = "../fuzz/src/lib.rs"]
#[allow(dead_code)]
mod targets;

use std::path::Path;

fn replay(target: &str, run: fn(&[u8])) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    let mut replayed = 0;
    for dir in ["corpus", "artifacts"] {
        let Ok(entries) = std::fs::read_dir(root.join(dir).join(target)) else {
            continue;
        };
        let mut paths: Vec<_> = entries.filter_map(Result::ok).map(|e| e.path()).collect();
        paths.sort();
        for path in paths
            .iter()
            .filter(|p| p.is_file() && p.file_name() != Some(".keep".as_ref()))
        {
            let data = std::fs::read(path).unwrap();
            let outcome = std::panic::catch_unwind(|| run(&data));
            assert!(outcome.is_ok(), "{target}: {} panics", path.display());
            replayed += 1;
        }
    }
    assert!(
        replayed >= 5,
        "{target}: only {replayed} corpus inputs found; the seed corpus is missing"
    );
}

#[test]
fn group_state_machine_corpus_replays_cleanly() {
    replay("group_state_machine", targets::group_state_machine);
}

#[test]
fn topic_patterns_corpus_replays_cleanly() {
    replay("topic_patterns", targets::topic_patterns);
}

#[test]
fn requests_corpus_replays_cleanly() {
    replay("requests", targets::requests);
}
