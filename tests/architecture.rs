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

/// The module path (below `src/cluster`) of each file under `root`, with its code.
fn modules_under(root: &Path) -> Vec<(Vec<String>, String)> {
    sources(root)
        .into_iter()
        .map(|file| {
            let relative = file.strip_prefix(root).unwrap().with_extension("");
            let mut path: Vec<String> = relative
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            if path.last().is_some_and(|last| last == "mod") {
                path.pop();
            }
            let text = std::fs::read_to_string(&file).unwrap();
            (path, code_of(&text))
        })
        .collect()
}

/// Every path a `use` tree names, written out: `a::{b, c::{d}}` gives `a::b`, `a::c::d`.
fn expand_use(tree: &str) -> Vec<String> {
    let tree = tree.trim();
    let Some(open) = tree.find('{') else {
        return vec![tree.split(" as ").next().unwrap_or(tree).trim().to_string()];
    };
    let (head, rest) = tree.split_at(open);
    let inner = &rest[1..rest.rfind('}').unwrap_or(rest.len())];
    let (mut items, mut depth, mut current) = (Vec::new(), 0, String::new());
    for c in inner.chars() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                items.push(std::mem::take(&mut current));
                continue;
            }
            _ => {}
        }
        current.push(c);
    }
    items.push(current);
    items
        .iter()
        .filter(|item| !item.trim().is_empty())
        .flat_map(|item| expand_use(item))
        .map(|path| {
            let path = path.trim_start_matches("self").trim_start_matches("::");
            format!("{head}{path}").trim_end_matches("::").to_string()
        })
        .collect()
}

/// The import graph of the modules under `root` (the crate path `base`, e.g.
/// `["cluster"]`): an edge for every `use` of, or path into, another module of them, leaving
/// out a module's own ancestors and descendants (a child always sees its parent).
fn import_graph(
    root: &Path,
    base: &[&str],
) -> std::collections::BTreeMap<String, std::collections::BTreeSet<String>> {
    let modules = modules_under(root);
    let known: std::collections::BTreeSet<Vec<String>> =
        modules.iter().map(|(path, _)| path.clone()).collect();
    let mut graph = std::collections::BTreeMap::new();
    for (path, code) in &modules {
        let mut named = Vec::new();
        let mut rest = code.as_str();
        while let Some(at) = rest.find("use ") {
            let before = rest[..at].chars().next_back();
            rest = &rest[at + 4..];
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
                continue;
            }
            let end = rest.find(';').unwrap_or(rest.len());
            named.extend(expand_use(&rest[..end]));
        }
        for (at, _) in code
            .match_indices("crate::")
            .chain(code.match_indices("super::"))
        {
            if code[..at]
                .chars()
                .next_back()
                .is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':')
            {
                continue;
            }
            let end = code[at..]
                .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
                .map_or(code.len(), |n| at + n);
            named.push(code[at..end].to_string());
        }
        let mut edges = std::collections::BTreeSet::new();
        for name in named {
            let segments: Vec<&str> = name.split("::").filter(|s| !s.is_empty()).collect();
            let target: Vec<String> = match segments.first() {
                Some(&"crate") => {
                    if segments.len() <= base.len() || segments[1..=base.len()] != *base {
                        continue;
                    }
                    segments[base.len() + 1..]
                        .iter()
                        .map(|s| s.to_string())
                        .collect()
                }
                Some(&"super") => {
                    let ups = segments.iter().take_while(|s| **s == "super").count();
                    let mut target = path[..path.len().saturating_sub(ups)].to_vec();
                    target.extend(segments[ups..].iter().map(|s| s.to_string()));
                    target
                }
                _ => continue,
            };
            let Some(found) = (1..=target.len())
                .rev()
                .map(|n| target[..n].to_vec())
                .find(|prefix| known.contains(prefix))
            else {
                continue;
            };
            if path.starts_with(&found) || found.starts_with(path) {
                continue;
            }
            edges.insert(found.join("::"));
        }
        graph.insert(path.join("::"), edges);
    }
    graph
}

/// A circle of `graph`, if it has one: its modules in order, the first again at the end.
fn circle_in(
    graph: &std::collections::BTreeMap<String, std::collections::BTreeSet<String>>,
) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &std::collections::BTreeMap<String, std::collections::BTreeSet<String>>,
        state: &mut std::collections::BTreeMap<String, u8>,
        stack: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        state.insert(node.to_string(), 1);
        stack.push(node.to_string());
        for next in graph.get(node).into_iter().flatten() {
            match state.get(next.as_str()) {
                Some(1) => {
                    let from = stack.iter().position(|n| n == next).unwrap_or(0);
                    let mut circle = stack[from..].to_vec();
                    circle.push(next.clone());
                    return Some(circle);
                }
                Some(_) => {}
                None => {
                    if let Some(circle) = visit(next, graph, state, stack) {
                        return Some(circle);
                    }
                }
            }
        }
        stack.pop();
        state.insert(node.to_string(), 2);
        None
    }
    let mut state = std::collections::BTreeMap::new();
    for node in graph.keys() {
        if !state.contains_key(node.as_str())
            && let Some(circle) = visit(node, graph, &mut state, &mut Vec::new())
        {
            return Some(circle);
        }
    }
    None
}

/// The graph with every module folded into its room: `gateway::data::bridge::lease` into
/// `gateway::data`, `coordinator::line` into `coordinator`.
fn rooms_of(
    graph: &std::collections::BTreeMap<String, std::collections::BTreeSet<String>>,
) -> std::collections::BTreeMap<String, std::collections::BTreeSet<String>> {
    let room = |module: &str| {
        let segments: Vec<&str> = module.split("::").collect();
        let depth = if segments.first() == Some(&"gateway") {
            2
        } else {
            1
        };
        segments[..segments.len().min(depth)].join("::")
    };
    let mut rooms: std::collections::BTreeMap<String, std::collections::BTreeSet<String>> =
        std::collections::BTreeMap::new();
    for (from, edges) in graph {
        let entry = rooms.entry(room(from)).or_default();
        for to in edges {
            if room(to) != room(from) && !room(from).is_empty() && !room(to).is_empty() {
                entry.insert(room(to));
            }
        }
    }
    rooms
}

// docs/architecture.md#cluster-mode-by-room: no import circle inside src/cluster, between its
// files or between its rooms (the gateway's api → data → control → wire, the coordinator, the
// backplane and its NATS side), so each can be read, and replaced, below the ones that use it.
#[test]
fn cluster_mode_has_no_import_circle() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/cluster");
    let graph = import_graph(&root, &["cluster"]);
    assert!(graph.len() > 30, "the graph was not read: {graph:?}");
    assert!(
        graph["gateway::data::bridge"].contains("gateway::data::acks"),
        "the graph misses a known import: {:?}",
        graph["gateway::data::bridge"]
    );
    if let Some(circle) = circle_in(&graph) {
        panic!(
            "an import circle inside src/cluster: {} (docs/architecture.md#cluster-mode-by-room)",
            circle.join(" → ")
        );
    }
    if let Some(circle) = circle_in(&rooms_of(&graph)) {
        panic!(
            "an import circle between the rooms of src/cluster: {} (docs/architecture.md#cluster-mode-by-room)",
            circle.join(" → ")
        );
    }
}

// docs/architecture.md#cluster-mode-by-room: no file in src/cluster passes 800 lines; one that
// does is two things.
#[test]
fn no_file_in_cluster_mode_passes_800_lines() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/cluster");
    let long: Vec<String> = sources(&root)
        .into_iter()
        .filter_map(|file| {
            let lines = std::fs::read_to_string(&file).unwrap().lines().count();
            (lines > 800).then(|| format!("{}: {lines} lines", file.display()))
        })
        .collect();
    assert!(long.is_empty(), "files over 800 lines: {long:?}");
}

// The circle guard itself: it finds a circle through `use` groups, `super::` and `crate::`
// paths, and none where a child only uses its parent.
#[test]
fn the_circle_guard_finds_a_planted_circle() {
    let dir = std::env::temp_dir().join(format!("tinybroker-circles-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("room")).unwrap();
    let write = |name: &str, text: &str| std::fs::write(dir.join(name), text).unwrap();
    write("mod.rs", "pub mod room;\npub mod other;\nstruct Shared;\n");
    write("room/mod.rs", "pub mod a;\npub mod b;\n");
    write(
        "room/a.rs",
        "use crate::probe::{Shared, room::{b::B}};\npub struct A;\n",
    );
    write("room/b.rs", "use super::super::Shared;\npub struct B;\n");
    write(
        "other.rs",
        "// crate::probe::room::a names nothing in a comment\npub struct O;\n",
    );
    let graph = import_graph(&dir, &["probe"]);
    assert_eq!(
        graph["room::a"],
        ["room::b".to_string()].into(),
        "{graph:?}"
    );
    assert!(
        graph["room::b"].is_empty(),
        "a child's use of its parent is no edge: {graph:?}"
    );
    assert!(
        graph["other"].is_empty(),
        "comments name nothing: {graph:?}"
    );
    assert_eq!(circle_in(&graph), None);
    write("room/b.rs", "pub struct B(crate::probe::room::a::A);\n");
    let graph = import_graph(&dir, &["probe"]);
    let circle = circle_in(&graph).expect("the planted circle");
    assert_eq!(circle.first(), circle.last(), "{circle:?}");
    assert!(circle.contains(&"room::a".to_string()) && circle.contains(&"room::b".to_string()));
    write("room/b.rs", "pub struct B;\n");
    write("other.rs", "use crate::probe::room::a::A;\n");
    write("room/a.rs", "pub struct A(super::super::other::O);\n");
    let rooms = rooms_of(&import_graph(&dir, &["probe"]));
    assert!(
        circle_in(&rooms).is_some(),
        "room → other → room: {rooms:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
