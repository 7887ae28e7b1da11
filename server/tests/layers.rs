//! The server's layers run one way (see `docs/design.md`): the HTTP edge (`http`) imports the
//! domain (`room`, `terminal`, `sandbox`, `accounts`), the domain imports what is below it
//! (`audit`, `store`, `config`, `metrics`, `registry`, `clock`, `close`, `ids`, `fault`), and
//! nothing imports upward. This test reads `server/src` and fails on the first upward `crate::` path.
//!
//! To see it fail: add `use crate::http::AppState;` to `server/src/room/task.rs` and run
//! `cargo test -p coderoom-server --test layers`; `an_upward_import_is_caught` shows the same
//! on a made-up tree without touching the sources.

use std::path::{Path, PathBuf};

/// Higher layers may import lower ones, never the reverse.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Layer {
    Below,
    Domain,
    /// The application layer (`ops`): every room operation, whichever door asks.
    App,
    Edge,
    /// The entry points (`lib.rs`, `cli.rs`, `serve.rs`, `tiers.rs`): they put the whole
    /// server together, or run it.
    Top,
}

/// The layer of a top-level module of `server/src`, or `None` for a module this test does not
/// know (which fails the test: every module must be placed).
fn layer_of(module: &str) -> Option<Layer> {
    Some(match module {
        "http" => Layer::Edge,
        "ops" => Layer::App,
        "room" | "terminal" | "sandbox" | "accounts" | "secrets" | "egress" | "repos" | "spend" => {
            Layer::Domain
        }
        "audit" | "store" | "config" | "metrics" | "registry" | "clock" | "close" | "ids"
        | "fault" => Layer::Below,
        // `tiers` (`coderoom bench tiers`) runs servers as child processes and reads what a
        // server's receipts read: an entry point beside `cli`.
        "lib" | "main" | "cli" | "serve" | "tiers" => Layer::Top,
        _ => return None,
    })
}

/// The top-level module a source file belongs to: `room/task.rs` and `room.rs` are `room`.
fn module_of(relative: &Path) -> String {
    let first = relative
        .components()
        .next()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .unwrap_or_default();
    first.trim_end_matches(".rs").to_owned()
}

/// The top-level modules a source names through `crate::`, comments left out.
fn imported_modules(source: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in source.lines() {
        let code = line.split("//").next().unwrap_or("");
        let mut rest = code;
        while let Some(at) = rest.find("crate::") {
            // `coderoom_server::`-style paths and identifiers ending in "crate" are not ours.
            let before = rest[..at].chars().next_back();
            let after = &rest[at + "crate::".len()..];
            rest = after;
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
                continue;
            }
            if let Some(group) = after.strip_prefix('{') {
                let inner = group.split('}').next().unwrap_or("");
                for item in inner.split(',') {
                    let name = item.trim().split("::").next().unwrap_or("").trim();
                    if !name.is_empty() {
                        out.push(name.to_owned());
                    }
                }
            } else {
                let name: String = after
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                if !name.is_empty() {
                    out.push(name);
                }
            }
        }
    }
    out
}

/// Every upward import in `files` (`(path relative to src, source)`), as readable lines.
fn violations(files: &[(PathBuf, String)]) -> Vec<String> {
    let mut found = Vec::new();
    for (path, source) in files {
        let module = module_of(path);
        let Some(mine) = layer_of(&module) else {
            found.push(format!(
                "{}: module `{module}` has no layer; place it in tests/layers.rs and docs/design.md",
                path.display()
            ));
            continue;
        };
        for target in imported_modules(source) {
            if target == module {
                continue;
            }
            match layer_of(&target) {
                Some(theirs) if theirs > mine => found.push(format!(
                    "{}: `{module}` ({mine:?}) imports `crate::{target}` ({theirs:?}), upward",
                    path.display()
                )),
                _ => {}
            }
        }
    }
    found
}

fn sources(dir: &Path, root: &Path, out: &mut Vec<(PathBuf, String)>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .expect("read server/src")
        .map(|e| e.expect("read a directory entry").path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            sources(&path, root, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let text = std::fs::read_to_string(&path).expect("read a source file");
            let relative = path.strip_prefix(root).expect("under src").to_owned();
            out.push((relative, text));
        }
    }
}

#[test]
fn the_server_imports_only_downward() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&root, &root, &mut files);
    assert!(
        files.len() > 20,
        "found only {} source files under {}",
        files.len(),
        root.display()
    );
    let found = violations(&files);
    assert!(found.is_empty(), "upward imports:\n{}", found.join("\n"));
}

#[test]
fn an_upward_import_is_caught() {
    let tree = vec![
        (
            PathBuf::from("room/task.rs"),
            "use crate::store::Store;\nuse crate::http::AppState;\n".to_owned(),
        ),
        (
            PathBuf::from("store.rs"),
            "use crate::{config, room::Rooms};\n".to_owned(),
        ),
        (
            PathBuf::from("http/rooms.rs"),
            "// crate::cli is only mentioned here\nuse crate::room::Rooms;\n".to_owned(),
        ),
        (PathBuf::from("newthing.rs"), String::new()),
    ];
    let found = violations(&tree);
    assert_eq!(found.len(), 3, "{found:#?}");
    assert!(found[0].contains("room/task.rs") && found[0].contains("crate::http"));
    assert!(found[1].contains("store.rs") && found[1].contains("crate::room"));
    assert!(found[2].contains("newthing.rs") && found[2].contains("no layer"));
}

/// The error type of `Result<` arguments that start `args` (its second argument at the top
/// level, trimmed), if the line closes them.
fn error_type(args: &str) -> Option<&str> {
    let mut depth = 0usize;
    let mut comma = None;
    for (i, c) in args.char_indices() {
        match c {
            '<' | '(' | '[' => depth += 1,
            '>' | ')' | ']' if depth == 0 => return comma.map(|at: usize| args[at + 1..i].trim()),
            '>' | ')' | ']' => depth -= 1,
            ',' if depth == 0 => comma = Some(i),
            _ => {}
        }
    }
    None
}

#[test]
fn the_error_type_is_read_at_the_top_level() {
    assert_eq!(error_type("(), String> {"), Some("String"));
    assert_eq!(
        error_type("BTreeMap<String, String>, ApiError> {"),
        Some("ApiError")
    );
    assert_eq!(error_type("Vec<u8>, String>"), Some("String"));
    assert_eq!(error_type("T>"), None);
}

/// Errors are typed (one `thiserror` enum per operation family): no function of the
/// workspace's production code returns a bare `String` as its error.
#[test]
fn no_string_errors() {
    // The whole workspace's production code: the server, the sandbox crate, authz.
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for crate_src in ["src", "../sandbox-host/src", "../authz/src"] {
        let root = manifest.join(crate_src);
        let mut these = Vec::new();
        sources(&root, &root, &mut these);
        assert!(!these.is_empty(), "no sources under {}", root.display());
        files.extend(
            these
                .into_iter()
                .map(|(p, s)| (Path::new(crate_src).join(p), s)),
        );
    }
    let mut found = Vec::new();
    for (path, source) in &files {
        for (n, line) in production(source).lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            if let Some(at) = code.find("Result<") {
                if error_type(&code[at + "Result<".len()..]) == Some("String") {
                    found.push(format!("{}:{}: {}", path.display(), n + 1, line.trim()));
                }
            }
        }
    }
    assert!(found.is_empty(), "string errors:\n{}", found.join("\n"));
}

/// What only the application layer (`ops`) may do: decide an action, or write the audit chain.
/// Each is spotted in a source with its whitespace and comments removed, so a call split over
/// lines is found too.
const LAYER_ONLY: [(&str, &str); 5] = [
    ("decide(", "a decision (coderoom_authz::decide)"),
    (".audit.record(", "an audit write"),
    (
        ".audit.lock()",
        "the audit lock (a decide-then-record sequence)",
    ),
    ("locked.record(", "an audit write"),
    ("locked.deny(", "an audit write"),
];

/// `(file, what)` for each act only the application layer may perform, found in the edge.
fn edge_acts(files: &[(PathBuf, String)]) -> Vec<(String, &'static str)> {
    let mut found = Vec::new();
    for (path, source) in files {
        if module_of(path) != "http" {
            continue;
        }
        let squeezed: String = source
            .lines()
            .map(|l| l.split("//").next().unwrap_or(""))
            .collect::<String>()
            .chars()
            .filter(|c| !c.is_whitespace())
            .collect();
        for (needle, what) in LAYER_ONLY {
            let mut rest = squeezed.as_str();
            while let Some(at) = rest.find(needle) {
                let before = rest[..at].chars().next_back();
                rest = &rest[at + needle.len()..];
                // `decide(` as a whole name only (not `may_decide(`).
                if needle == "decide(" && before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
                    continue;
                }
                found.push((path.display().to_string(), what));
            }
        }
    }
    found
}

#[test]
fn only_the_application_layer_decides_and_records() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&root, &root, &mut files);
    let found: Vec<String> = edge_acts(&files)
        .into_iter()
        .map(|(file, what)| format!("{file}: {what}"))
        .collect();
    assert!(
        found.is_empty(),
        "the edge decides or writes the audit chain itself (move it into `ops`):\n{}",
        found.join("\n")
    );
}

#[test]
fn an_edge_decision_or_audit_write_is_caught() {
    let tree = vec![
        (
            PathBuf::from("http/rooms.rs"),
            "let p = app.audit\n    .record(&id, ...);\n// decide( in a comment\n".to_owned(),
        ),
        (
            PathBuf::from("http/files.rs"),
            "match coderoom_authz::decide(&who, &a, &s, now) {}\nops.may_decide(x)".to_owned(),
        ),
        (
            PathBuf::from("ops/rights.rs"),
            "match decide(&who, &a, &s, now) {}".to_owned(),
        ),
    ];
    let found = edge_acts(&tree);
    assert_eq!(
        found,
        vec![
            ("http/rooms.rs".to_owned(), "an audit write"),
            (
                "http/files.rs".to_owned(),
                "a decision (coderoom_authz::decide)"
            ),
        ],
        "the layer's own file is never reported; a comment and `may_decide(` are not acts"
    );
}

/// The production part of a source: every `#[cfg(test)]` item left out (a test module, a
/// test-only function or field), each up to its `;` or its closing brace. Tests may reach
/// across modules without tying them together.
fn production(source: &str) -> String {
    const MARK: &str = "#[cfg(test)]";
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(at) = rest.find(MARK) {
        out.push_str(&rest[..at]);
        rest = &rest[at + MARK.len()..];
        rest = &rest[item_end(rest)..];
    }
    out.push_str(rest);
    out
}

/// Where the item that starts `text` ends: after the `;` or the brace that closes it at the top
/// level (comments, strings and character literals skipped).
fn item_end(text: &str) -> usize {
    let bytes = text.as_bytes();
    let (mut i, mut depth) = (0, 0usize);
    while i < bytes.len() {
        match bytes[i] {
            b'/' if bytes.get(i + 1) == Some(&b'/') => {
                while i < bytes.len() && bytes[i] != b'\n' {
                    i += 1;
                }
            }
            b'"' => {
                i += 1;
                while i < bytes.len() && bytes[i] != b'"' {
                    i += if bytes[i] == b'\\' { 2 } else { 1 };
                }
            }
            // A character literal (`'{'`, `'\''`), not a lifetime.
            b'\'' if bytes.get(i + 2) == Some(&b'\'') => i += 2,
            b'\'' if bytes.get(i + 1) == Some(&b'\\') => i += 3,
            b'{' | b'(' | b'[' => depth += 1,
            b'}' | b')' | b']' => {
                depth = depth.saturating_sub(1);
                if depth == 0 && bytes[i] == b'}' {
                    return i + 1;
                }
            }
            b';' if depth == 0 => return i + 1,
            _ => {}
        }
        i += 1;
    }
    text.len()
}

#[test]
fn test_items_are_left_out_of_production() {
    let src = "fn a() {}\n#[cfg(test)]\nuse crate::x;\nfn b() {}\n#[cfg(test)]\nmod tests {\n    fn t() { let c = '}'; let s = \"}\"; }\n}\nfn c() {}\n";
    let kept = production(src);
    assert!(
        kept.contains("fn a()") && kept.contains("fn b()") && kept.contains("fn c()"),
        "{kept}"
    );
    assert!(
        !kept.contains("crate::x") && !kept.contains("fn t()"),
        "{kept}"
    );
}

/// Every import circle among the top-level modules of `files` (each as `a -> b -> a`), found
/// by walking the graph of which module names which through `crate::`.
fn circles(files: &[(PathBuf, String)]) -> Vec<String> {
    use std::collections::{BTreeMap, BTreeSet};
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (path, source) in files {
        let module = module_of(path);
        let entry = edges.entry(module.clone()).or_default();
        for target in imported_modules(&production(source)) {
            if target != module {
                entry.insert(target);
            }
        }
    }
    let known: BTreeSet<String> = edges.keys().cloned().collect();
    // A path from each module back to itself, depth first; each circle once, from its
    // smallest module.
    let mut found = BTreeSet::new();
    for start in &known {
        let mut stack = vec![(start.clone(), vec![start.clone()])];
        while let Some((at, path)) = stack.pop() {
            for next in edges.get(&at).into_iter().flatten() {
                if !known.contains(next) {
                    continue;
                }
                if next == start {
                    if path.iter().all(|m| m >= start) {
                        found.insert(format!("{} -> {start}", path.join(" -> ")));
                    }
                } else if !path.contains(next) && next > start {
                    let mut longer = path.clone();
                    longer.push(next.clone());
                    stack.push((next.clone(), longer));
                }
            }
        }
    }
    found.into_iter().collect()
}

#[test]
fn no_import_circle_among_top_level_modules() {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    for src in [manifest.join("src"), manifest.join("../sandbox-host/src")] {
        let mut files = Vec::new();
        sources(&src, &src, &mut files);
        assert!(
            files.len() > 10,
            "found only {} files in {}",
            files.len(),
            src.display()
        );
        let found = circles(&files);
        assert!(
            found.is_empty(),
            "import circles among the top-level modules of {}:\n{}",
            src.display(),
            found.join("\n")
        );
    }
}

#[test]
fn an_import_circle_is_caught() {
    let tree = vec![
        (
            PathBuf::from("config.rs"),
            "use crate::store::Options;\n".to_owned(),
        ),
        (
            PathBuf::from("store/docs.rs"),
            "let x = crate::config::comparison_switch(\"X\");\n".to_owned(),
        ),
        (
            PathBuf::from("room.rs"),
            "use crate::store::Store;\n".to_owned(),
        ),
        (
            PathBuf::from("sandbox.rs"),
            "use crate::room::Rooms;\n#[cfg(test)]\nmod tests { use crate::sandbox::X; }\n"
                .to_owned(),
        ),
    ];
    assert_eq!(circles(&tree), vec!["config -> store -> config".to_owned()]);
}

/// Longest production source file, before its tests: past it, split along the code's seams.
const MAX_FILE_LINES: usize = 1200;

#[test]
fn no_production_file_is_over_the_bound() {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut over = Vec::new();
    for crate_src in ["src", "../sandbox-host/src", "../authz/src"] {
        let root = manifest.join(crate_src);
        let mut files = Vec::new();
        sources(&root, &root, &mut files);
        for (path, source) in files {
            let lines = production(&source).lines().count();
            if lines > MAX_FILE_LINES {
                over.push(format!("{crate_src}/{}: {lines}", path.display()));
            }
        }
    }
    assert!(
        over.is_empty(),
        "production files over {MAX_FILE_LINES} lines before their tests:\n{}",
        over.join("\n")
    );
}

/// The environment variables production code may read, each with why it is not a switch of
/// behaviour for benchmarks: everything else is a `coderoom serve` flag, passed down.
const ENV_READS: [(&str, &str); 2] = [
    // The test fault points: debug builds only (release builds ignore it and say so).
    ("src/fault.rs", "ENV"),
    // Where programs are (the VMMs, bubblewrap), as any program finds them.
    ("../sandbox-host/src/process.rs", "\"PATH\""),
];

#[test]
fn no_environment_switch_in_production_code() {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut found = Vec::new();
    for crate_src in ["src", "../sandbox-host/src", "../authz/src"] {
        let root = manifest.join(crate_src);
        let mut files = Vec::new();
        sources(&root, &root, &mut files);
        for (path, source) in files {
            let file = format!("{crate_src}/{}", path.display());
            let code: String = production(&source)
                .lines()
                .map(|l| l.split("//").next().unwrap_or(""))
                .collect::<Vec<_>>()
                .join("\n");
            for (at, _) in code.match_indices("env::var") {
                let call = &code[at..];
                let argument = call
                    .split_once('(')
                    .map(|(_, rest)| rest.split(')').next().unwrap_or("").trim())
                    .unwrap_or("");
                if !ENV_READS.contains(&(file.as_str(), argument)) {
                    found.push(format!("{file}: env::var({argument})"));
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "production code reads the environment (make it a flag):\n{}",
        found.join("\n")
    );
}
