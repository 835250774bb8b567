//! Every command shown in README.md and docs/*.md is run here or named as covered, so none goes
//! stale; every local link in them leads somewhere.
//!
//! Each fenced ```sh block must follow (blank lines between allowed) one marker comment:
//!
//! - `<!-- run -->`: each command runs, in order, against a broker this test starts for the file
//!   on a free loopback port (`TINYBROKER_SERVER` points at it, `TINYBROKER_LISTEN` is port 0 so
//!   a `serve` binds a free port too), and must exit 0 within [`COMMAND_TIMEOUT`].
//!   `cargo run --release --` and `cargo run --` are replaced by the built binary, and
//!   `tinybroker` is that binary on the `PATH`.
//! - `<!-- run: until "REGEX" -->`: commands that run until stopped (`serve`, `subscribe`): each is
//!   started and must print a line matching REGEX (stdout or stderr) within the timeout. It keeps
//!   running until the end of the file, so a later `run` block can publish to it.
//! - `<!-- run: messages=N -->`: as `run`, with every `bench` run's `--messages` set to N (the
//!   workload as documented, smaller).
//! - `<!-- covered-by: PATH::NAME, … -->`: the commands are run by those tests (a `fn NAME` in
//!   PATH) or, naming only a PATH (`benches/core.rs`), built by CI (`cargo clippy --all-targets`).
//! - `<!-- ci -->`: every command appears in `.ci/run` (its `--locked` and shell variables
//!   aside).
//!
//! An unmarked block, a marker naming a test or file that does not exist, or a command that fails
//! fails this test. Waiting is always for output, with a timeout; nothing sleeps.

use std::{
    collections::BTreeSet,
    io::{BufRead, BufReader, Read},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
const BINARY: &str = env!("CARGO_BIN_EXE_tinybroker");
/// How long one command may take, and how long a long-running one may take to print its line.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(60);

fn documents() -> Vec<PathBuf> {
    let root = Path::new(ROOT);
    let mut docs = vec![root.join("README.md")];
    for extra in ["CHANGELOG.md"] {
        if root.join(extra).exists() {
            docs.push(root.join(extra));
        }
    }
    let mut pages: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .map(|dir| {
            dir.filter_map(Result::ok)
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == "md"))
                .collect()
        })
        .unwrap_or_default();
    pages.sort();
    docs.extend(pages);
    docs
}

#[derive(Debug, Clone, PartialEq)]
enum Marker {
    Run { messages: Option<u64> },
    Until(String),
    CoveredBy(Vec<String>),
    Ci,
}

#[derive(Debug)]
struct Block {
    line: usize,
    marker: Option<Marker>,
    commands: Vec<String>,
}

fn parse_marker(comment: &str) -> Result<Marker, String> {
    let body = comment.trim();
    if body == "run" {
        return Ok(Marker::Run { messages: None });
    }
    if body == "ci" {
        return Ok(Marker::Ci);
    }
    if let Some(rest) = body.strip_prefix("run: until ") {
        let pattern = rest.trim().trim_matches('"');
        return Ok(Marker::Until(pattern.to_string()));
    }
    if let Some(rest) = body.strip_prefix("run: messages=") {
        let n = rest
            .trim()
            .parse()
            .map_err(|_| format!("bad count in {body:?}"))?;
        return Ok(Marker::Run { messages: Some(n) });
    }
    if let Some(rest) = body.strip_prefix("covered-by:") {
        let names: Vec<String> = rest.split(',').map(|s| s.trim().to_string()).collect();
        if names.iter().any(String::is_empty) {
            return Err(format!("empty name in {body:?}"));
        }
        return Ok(Marker::CoveredBy(names));
    }
    Err(format!("unknown marker {body:?}"))
}

/// The commands of a block: comment lines and blank lines dropped, `\` continuations joined.
fn commands(lines: &[&str]) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    for line in lines {
        let trimmed = line.trim();
        if current.is_empty() && (trimmed.is_empty() || trimmed.starts_with('#')) {
            continue;
        }
        if let Some(head) = trimmed.strip_suffix('\\') {
            current.push_str(head);
            current.push(' ');
        } else {
            current.push_str(trimmed);
            out.push(std::mem::take(&mut current));
        }
    }
    if !current.is_empty() {
        out.push(current);
    }
    out
}

fn blocks(text: &str) -> Result<Vec<Block>, String> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    let mut marker: Option<Result<Marker, String>> = None;
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i].trim();
        if let Some(comment) = line
            .strip_prefix("<!--")
            .and_then(|rest| rest.strip_suffix("-->"))
        {
            marker = Some(parse_marker(comment));
            i += 1;
            continue;
        }
        if let Some(fence) = line.strip_prefix("```") {
            let lang = fence.trim();
            let start = i;
            let mut end = i + 1;
            while end < lines.len() && !lines[end].trim().starts_with("```") {
                end += 1;
            }
            if lang == "sh" || lang == "bash" || lang == "shell" || lang == "console" {
                let marker = match marker.take() {
                    Some(Ok(m)) => Some(m),
                    Some(Err(e)) => return Err(format!("line {}: {e}", start + 1)),
                    None => None,
                };
                out.push(Block {
                    line: start + 1,
                    marker,
                    commands: commands(&lines[start + 1..end.min(lines.len())]),
                });
            }
            marker = None;
            i = end + 1;
            continue;
        }
        if !line.is_empty() {
            marker = None;
        }
        i += 1;
    }
    Ok(out)
}

/// A process whose output lines arrive on a channel, killed when dropped.
struct Running {
    child: Child,
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Running {
    fn start(command: &str, env: &[(String, String)]) -> Running {
        let mut child = shell(command, env)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {command:?}: {e}"));
        let (tx, rx) = mpsc::channel();
        for stream in [
            Box::new(child.stdout.take().unwrap()) as Box<dyn Read + Send>,
            Box::new(child.stderr.take().unwrap()),
        ] {
            let tx = tx.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stream).lines() {
                    let Ok(line) = line else { break };
                    if tx.send(line).is_err() {
                        break;
                    }
                }
            });
        }
        Running {
            child,
            lines: rx,
            seen: Vec::new(),
        }
    }

    /// Waits for a line that `matches`, up to `timeout`.
    fn wait_for(&mut self, matches: impl Fn(&str) -> bool, timeout: Duration) -> Option<String> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if matches(&line) {
                        return Some(line);
                    }
                }
                Err(_) => return None,
            }
        }
    }

    /// Waits for the process to exit (both output streams closed), up to `timeout`.
    fn finish(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => self.seen.push(line),
                Err(mpsc::RecvTimeoutError::Disconnected) => return self.child.wait().ok(),
                Err(mpsc::RecvTimeoutError::Timeout) => return None,
            }
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn shell(command: &str, env: &[(String, String)]) -> Command {
    let bin_dir = Path::new(BINARY).parent().unwrap();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut cmd = Command::new("bash");
    // `exec`, so that killing the child kills the command itself, not only its shell.
    cmd.arg("-c")
        .arg(format!("exec {command}"))
        .current_dir(ROOT)
        .env("PATH", path)
        .env_remove("TINYBROKER_AUTH_TOKEN")
        .env_remove("TINYBROKER_AUTH_TOKEN_FILE");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd
}

/// The command as this test runs it: the built binary in place of `cargo run`.
fn as_run(command: &str, messages: Option<u64>) -> String {
    let mut command = command.to_string();
    for prefix in ["cargo run --release -- ", "cargo run -- "] {
        if let Some(rest) = command.strip_prefix(prefix) {
            command = format!("{BINARY} {rest}");
        }
    }
    if let Some(n) = messages {
        let words: Vec<&str> = command.split_whitespace().collect();
        if let Some(at) = words.iter().position(|w| *w == "bench") {
            let mut out: Vec<String> = Vec::new();
            let mut skip = false;
            for (i, w) in words.iter().enumerate() {
                if skip {
                    skip = false;
                    continue;
                }
                if *w == "--messages" {
                    skip = true;
                    continue;
                }
                out.push((*w).to_string());
                if i == at {
                    out.push(format!("--messages {n}"));
                }
            }
            command = out.join(" ");
        }
    }
    command
}

/// A broker for one document's `run` blocks, started on a free port.
struct Broker {
    _process: Running,
    env: Vec<(String, String)>,
}

fn start_broker() -> Broker {
    let mut process = Running::start(
        &format!("{BINARY} serve --listen 127.0.0.1:0"),
        &[("RUST_LOG".into(), "info".into())],
    );
    let line = process
        .wait_for(|l| l.contains("tinybroker listening on "), COMMAND_TIMEOUT)
        .unwrap_or_else(|| panic!("the broker did not start: {:?}", process.seen));
    let addr = line
        .split("tinybroker listening on ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .expect("an address")
        .to_string();
    Broker {
        _process: process,
        env: vec![
            ("TINYBROKER_SERVER".into(), format!("http://{addr}")),
            ("TINYBROKER_LISTEN".into(), "127.0.0.1:0".into()),
            // The lines the docs promise (`tinybroker listening on …`) are logged at info.
            ("RUST_LOG".into(), "info".into()),
        ],
    }
}

/// `fn name` in `path`, or, naming only a path, the file (a bench target CI builds).
fn check_covered(name: &str) -> Result<(), String> {
    let (path, test) = match name.split_once("::") {
        Some((path, test)) => (path, Some(test)),
        None => (name, None),
    };
    let text = std::fs::read_to_string(Path::new(ROOT).join(path))
        .map_err(|e| format!("covered-by {name}: {path}: {e}"))?;
    if let Some(test) = test
        && !text.contains(&format!("fn {test}("))
    {
        return Err(format!("covered-by {name}: no fn {test} in {path}"));
    }
    Ok(())
}

/// The commands `.ci/run` runs, continuations joined, as patterns: a shell variable matches any
/// word, `--locked` is ignored.
fn ci_commands() -> Vec<Vec<String>> {
    let text = std::fs::read_to_string(Path::new(ROOT).join(".ci/run")).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    commands(&lines).into_iter().map(|c| words(&c)).collect()
}

fn words(command: &str) -> Vec<String> {
    command
        .split_whitespace()
        .filter(|w| *w != "--locked")
        .map(|w| w.trim_matches('(').trim_matches(')').to_string())
        .filter(|w| !w.is_empty())
        .collect()
}

fn ci_runs(command: &str, ci: &[Vec<String>]) -> bool {
    let wanted = words(command);
    let same = |pattern: &str, word: &str| {
        if pattern.contains('$') {
            // `-max_total_time="${TINYBROKER_FUZZ_SECONDS:-30}"`: the text before the variable.
            let head = pattern.split('$').next().unwrap_or("");
            word.starts_with(head.trim_end_matches('"'))
        } else {
            pattern == word
        }
    };
    // The first word must match as written, so that two shell variables in a row cannot stand
    // for a whole command.
    ci.iter().any(|line| {
        line.windows(wanted.len())
            .any(|w| !w[0].contains('$') && w.iter().zip(&wanted).all(|(p, x)| same(p, x)))
    })
}

fn check_document(path: &Path) -> Vec<String> {
    let name = path
        .strip_prefix(ROOT)
        .unwrap_or(path)
        .display()
        .to_string();
    let text = std::fs::read_to_string(path).unwrap();
    let blocks = match blocks(&text) {
        Ok(blocks) => blocks,
        Err(e) => return vec![format!("{name}: {e}")],
    };
    let mut failures = Vec::new();
    let mut broker: Option<Broker> = None;
    let mut long_running: Vec<Running> = Vec::new();
    let ci = ci_commands();
    for block in blocks {
        let at = format!("{name}:{}", block.line);
        let Some(marker) = block.marker else {
            failures.push(format!(
                "{at}: a sh block without a marker (<!-- run -->, <!-- covered-by: … -->, …)"
            ));
            continue;
        };
        match marker {
            Marker::CoveredBy(names) => {
                for n in names {
                    if let Err(e) = check_covered(&n) {
                        failures.push(format!("{at}: {e}"));
                    }
                }
            }
            Marker::Ci => {
                for command in &block.commands {
                    if !ci_runs(command, &ci) {
                        failures.push(format!("{at}: .ci/run does not run {command:?}"));
                    }
                }
            }
            Marker::Run { messages } => {
                let env = broker.get_or_insert_with(start_broker).env.clone();
                for command in &block.commands {
                    let run = as_run(command, messages);
                    let started = Instant::now();
                    let mut process = Running::start(&run, &env);
                    match process.finish(COMMAND_TIMEOUT) {
                        Some(status) if status.success() => eprintln!(
                            "ok   {at}: {command} ({:.1} s)",
                            started.elapsed().as_secs_f64()
                        ),
                        Some(status) => failures.push(format!(
                            "{at}: {command:?} exited with {status}: {}",
                            process.seen.join("\n")
                        )),
                        None => failures.push(format!(
                            "{at}: {command:?} did not finish within {COMMAND_TIMEOUT:?}: {}",
                            process.seen.join("\n")
                        )),
                    }
                }
            }
            Marker::Until(pattern) => {
                let env = broker.get_or_insert_with(start_broker).env.clone();
                let wanted = Regex::new(&pattern);
                for command in &block.commands {
                    let mut process = Running::start(&as_run(command, None), &env);
                    match process.wait_for(|l| wanted.is_match(l), COMMAND_TIMEOUT) {
                        Some(line) => eprintln!("ok   {at}: {command} printed {line:?}"),
                        None => failures.push(format!(
                            "{at}: {command:?} printed no line matching {pattern:?}: {}",
                            process.seen.join("\n")
                        )),
                    }
                    long_running.push(process);
                }
            }
        }
    }
    drop(long_running);
    drop(broker);
    failures
}

/// Alternatives of plain substrings (`a|b|c`), enough for "the first line says this".
struct Regex(Vec<String>);

impl Regex {
    fn new(pattern: &str) -> Self {
        Regex(pattern.split('|').map(str::to_string).collect())
    }

    fn is_match(&self, line: &str) -> bool {
        self.0
            .iter()
            .any(|alternative| line.contains(alternative.as_str()))
    }
}

#[test]
fn every_command_in_the_docs_is_run_or_covered() {
    let mut failures = Vec::new();
    for doc in documents() {
        failures.extend(check_document(&doc));
    }
    assert!(
        failures.is_empty(),
        "{} problem(s):\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// The anchors a page offers: explicit `<a id>`s and its headings' GitHub slugs.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in text.lines() {
        let mut rest = line;
        while let Some(at) = rest.find("<a id=\"") {
            rest = &rest[at + 7..];
            if let Some(end) = rest.find('"') {
                out.insert(rest[..end].to_string());
            }
        }
        let trimmed = line.trim_start();
        if trimmed.starts_with('#') {
            let heading = trimmed.trim_start_matches('#').trim();
            let slug: String = heading
                .to_lowercase()
                .chars()
                .filter(|c| c.is_alphanumeric() || *c == '-' || *c == ' ' || *c == '_')
                .map(|c| if c == ' ' { '-' } else { c })
                .collect();
            out.insert(slug);
        }
    }
    out
}

/// `](target)` links outside code: relative file links, with an optional `#anchor`.
fn links(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut in_code = false;
    for (number, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            in_code = !in_code;
            continue;
        }
        if in_code {
            continue;
        }
        let mut rest = line;
        while let Some(at) = rest.find("](") {
            rest = &rest[at + 2..];
            let Some(end) = rest.find(')') else { break };
            let target = &rest[..end];
            if !target.contains("://") && !target.starts_with("mailto:") && !target.is_empty() {
                out.push((number + 1, target.to_string()));
            }
            rest = &rest[end..];
        }
    }
    out
}

#[test]
fn every_local_link_in_the_docs_leads_somewhere() {
    let mut failures = Vec::new();
    // Pages others write that are not here yet (they land with their own work): links to them
    // are checked once they exist.
    let pending = ["docs/clients.md", "clients/python/README.md"];
    for doc in documents() {
        let name = doc.strip_prefix(ROOT).unwrap().display().to_string();
        let text = std::fs::read_to_string(&doc).unwrap();
        for (line, target) in links(&text) {
            let (file, anchor) = match target.split_once('#') {
                Some((file, anchor)) => (file, Some(anchor)),
                None => (target.as_str(), None),
            };
            let resolved = if file.is_empty() {
                doc.clone()
            } else {
                doc.parent().unwrap().join(file)
            };
            let relative = resolved
                .canonicalize()
                .ok()
                .and_then(|p| p.strip_prefix(ROOT).ok().map(|p| p.display().to_string()));
            if !resolved.exists() {
                let logical = Path::new(&name).parent().unwrap().join(file);
                let logical = logical.display().to_string();
                if pending.iter().any(|p| logical.ends_with(p)) {
                    continue;
                }
                failures.push(format!("{name}:{line}: {target} does not exist"));
                continue;
            }
            if let (Some(anchor), true) = (anchor, resolved.extension().is_some_and(|x| x == "md"))
            {
                let page = std::fs::read_to_string(&resolved).unwrap();
                if !anchors(&page).contains(anchor) {
                    failures.push(format!(
                        "{name}:{line}: {target}: no anchor #{anchor} in {}",
                        relative.unwrap_or_default()
                    ));
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} broken link(s):\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// `--flag`s named in a text.
fn flags(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let bytes = text.as_bytes();
    let mut i = 0;
    while i + 2 < bytes.len() {
        let starts = bytes[i] == b'-'
            && bytes[i + 1] == b'-'
            && bytes[i + 2].is_ascii_lowercase()
            && (i == 0 || !(bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'-'));
        if starts {
            let end = text[i + 2..]
                .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'))
                .map_or(text.len(), |at| i + 2 + at);
            out.insert(text[i..end].trim_end_matches('-').to_string());
            i = end;
        } else {
            i += 1;
        }
    }
    out
}

#[test]
fn the_configuration_page_names_every_serve_flag() {
    let output = Command::new(BINARY)
        .args(["serve", "--help"])
        .output()
        .expect("tinybroker serve --help runs");
    assert!(output.status.success(), "serve --help failed");
    let help = String::from_utf8_lossy(&output.stdout);
    let page = std::fs::read_to_string(Path::new(ROOT).join("docs/configuration.md")).unwrap();
    let named = flags(&page);
    let missing: Vec<String> = flags(&help)
        .into_iter()
        .filter(|f| f != "--help" && !named.contains(f))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/configuration.md does not name these `serve` flags: {missing:?}"
    );
}
