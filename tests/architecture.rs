//! The layering, checked on the source (docs/architecture.md): the gRPC service and the server
//! reach cluster mode only through the backend seam (`src/backend`), and cluster mode knows
//! nothing of gRPC statuses or of the service. Together these keep the import graph free of
//! the old circle (service → gateway → service) and keep "errors become a status in one
//! place" true.

use std::path::{Path, PathBuf};

/// Every `.rs` file under `dir`, recursively, in a stable order.
fn sources(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            found.extend(sources(&path));
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            found.push(path);
        }
    }
    found
}

/// The files of a module: `src/<name>.rs` if there is one, and everything under `src/<name>/`.
fn module(name: &str) -> Vec<PathBuf> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    let single = src.join(format!("{name}.rs"));
    if single.exists() {
        files.push(single);
    }
    let dir = src.join(name);
    if dir.is_dir() {
        files.extend(sources(&dir));
    }
    assert!(!files.is_empty(), "no module {name} under src/");
    files
}

/// The source with comments removed (line comments, doc comments and block comments), so a
/// doc that names a module is not taken for a use of it. String literals are kept.
fn code_of(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    let (mut in_string, mut escaped) = (false, false);
    while let Some(c) = chars.next() {
        if in_string {
            out.push(c);
            match (escaped, c) {
                (true, _) => escaped = false,
                (false, '\\') => escaped = true,
                (false, '"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match (c, chars.peek()) {
            ('/', Some('/')) => {
                for c in chars.by_ref() {
                    if c == '\n' {
                        out.push('\n');
                        break;
                    }
                }
            }
            ('/', Some('*')) => {
                chars.next();
                let mut last = ' ';
                for c in chars.by_ref() {
                    if last == '*' && c == '/' {
                        break;
                    }
                    last = c;
                }
            }
            ('"', _) => {
                in_string = true;
                out.push(c);
            }
            _ => out.push(c),
        }
    }
    out
}

/// Whether `line` holds `needle` not as the tail of a longer name (`EndStatus::` is not
/// `Status::`).
fn holds(line: &str, needle: &str) -> bool {
    line.match_indices(needle).any(|(at, _)| {
        !line[..at]
            .chars()
            .next_back()
            .is_some_and(|c| c.is_alphanumeric() || c == '_')
    })
}

/// Every (file, line number, line) of `files` whose code mentions one of `needles`.
fn mentions(files: &[PathBuf], needles: &[&str]) -> Vec<String> {
    let mut found = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(file).unwrap();
        for (n, line) in code_of(&text).lines().enumerate() {
            if needles.iter().any(|needle| holds(line, needle)) {
                found.push(format!("{}:{}: {}", file.display(), n + 1, line.trim()));
            }
        }
    }
    found
}

/// How a file may name a module of this crate: by path, or inside a `use crate::{…}` group.
fn uses_of(module: &str) -> Vec<String> {
    vec![
        format!("crate::{module}"),
        format!("tinybroker::{module}"),
        format!("    {module}::"),
        format!("{{{module}::"),
        format!(" {module}::{{"),
        format!("    {module},"),
        format!("{{{module},"),
        format!(", {module}}}"),
        format!(", {module},"),
    ]
}

fn assert_none(what: &str, found: Vec<String>) {
    assert!(
        found.is_empty(),
        "{what}:\n{}\n(see docs/architecture.md: the service and the server reach cluster mode only through src/backend; cluster mode returns core::Error and never builds a gRPC status)",
        found.join("\n")
    );
}

// The service and the server do not branch on the deployment: they see a `Backend`, never the
// gateway or anything else of cluster mode.
#[test]
fn the_service_and_the_server_do_not_import_cluster_mode() {
    let needles = uses_of("cluster");
    let needles: Vec<&str> = needles.iter().map(String::as_str).collect();
    for layer in ["service", "server", "transport"] {
        assert_none(
            &format!("src/{layer} imports cluster mode"),
            mentions(&module(layer), &needles),
        );
    }
}

// Cluster mode returns domain errors: it neither imports the service (whose `status` is the
// one place errors become statuses) nor builds or inspects a `tonic::Status` or `Code`.
#[test]
fn cluster_mode_neither_imports_the_service_nor_speaks_grpc_statuses() {
    let cluster = module("cluster");
    let needles = uses_of("service");
    let needles: Vec<&str> = needles.iter().map(String::as_str).collect();
    assert_none(
        "src/cluster imports the service",
        mentions(&cluster, &needles),
    );
    assert_none(
        "src/cluster builds or reads a gRPC status",
        mentions(&cluster, &["tonic", "Status::", "Code::", "Status {"]),
    );
}

// The transport facts are a leaf: both the server and the service import them, so they import
// neither (nor the backend behind the service).
#[test]
fn the_transport_module_is_a_leaf() {
    let mut needles = Vec::new();
    for module in ["server", "service", "backend", "cluster"] {
        needles.extend(uses_of(module));
    }
    let needles: Vec<&str> = needles.iter().map(String::as_str).collect();
    assert_none(
        "src/transport imports a layer above it",
        mentions(&module("transport"), &needles),
    );
}

// The guard itself: it finds what it looks for, in every form a use can take, and not in
// comments.
#[test]
fn the_guard_finds_uses_and_skips_comments() {
    let dir = std::env::temp_dir().join(format!("tinybroker-architecture-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("probe.rs");
    std::fs::write(
        &file,
        "//! Mentions crate::cluster in a doc.\n/* crate::cluster */\nuse crate::{\n    broker::Broker,\n    cluster::gateway::Gateway,\n};\nfn f() -> tonic::Status { todo!() }\n",
    )
    .unwrap();
    let needles = uses_of("cluster");
    let needles: Vec<&str> = needles.iter().map(String::as_str).collect();
    let found = mentions(std::slice::from_ref(&file), &needles);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].contains("cluster::gateway::Gateway"), "{found:?}");
    assert_eq!(mentions(std::slice::from_ref(&file), &["tonic"]).len(), 1);
    assert!(mentions(&[file], &["Status::"]).is_empty() && !holds("EndStatus::X", "Status::"));
    let _ = std::fs::remove_dir_all(&dir);
}
