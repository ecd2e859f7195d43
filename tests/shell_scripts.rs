//! The shell scripts (all under `set -o pipefail`, their own or that of
//! the script sourcing them) never pipe into a reader that stops early:
//! `grep -q` or `head`.
//!
//! Such a reader exits at its first match or line; a writer still writing
//! then dies of SIGPIPE, and pipefail turns the match into a failure (or,
//! under `!`, a miss into a pass). The cluster e2e lost a run to exactly
//! this: `ip -o link show | grep -q MAC` on a node with many links. Scripts
//! read the whole input instead (`grep X >/dev/null`, `sed -n 1p`) or grep
//! captured text.

use std::path::{Path, PathBuf};

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Every shell script the project runs: scripts/, scripts/cluster/, .ci/run.
fn scripts() -> Vec<PathBuf> {
    let mut out = vec![repo().join(".ci/run")];
    for dir in ["scripts", "scripts/cluster"] {
        let entries = std::fs::read_dir(repo().join(dir)).expect("read scripts dir");
        for entry in entries {
            let path = entry.expect("dir entry").path();
            if path.extension().is_some_and(|e| e == "sh") {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

/// Whether `line` pipes (a single `|`, not `||`) into `head` or into a
/// `grep` whose flags include `q`.
fn pipes_into_early_exit(line: &str) -> bool {
    let code = line.trim_start();
    if code.starts_with('#') {
        return false;
    }
    let piped = |at: usize| {
        let before = code[..at].trim_end();
        before.ends_with('|') && !before.ends_with("||")
    };
    let quiet_grep = code.match_indices("grep -").any(|(at, m)| {
        let quiet = code[at + m.len()..]
            .bytes()
            .take_while(u8::is_ascii_alphabetic)
            .any(|b| b == b'q');
        piped(at) && quiet
    });
    let head = code.match_indices("head").any(|(at, m)| {
        let word_ends = code[at + m.len()..]
            .chars()
            .next()
            .is_none_or(|c| !c.is_ascii_alphanumeric() && c != '_');
        piped(at) && word_ends
    });
    quiet_grep || head
}

#[test]
fn the_detector_tells_a_pipe_from_an_or() {
    assert!(pipes_into_early_exit("ip -o link show | grep -q \"$mac\""));
    assert!(pipes_into_early_exit("! attachments | grep -qv x"));
    assert!(pipes_into_early_exit("a |grep -iq x"));
    assert!(!pipes_into_early_exit(
        "ip -o link show | grep \"$mac\" >/dev/null"
    ));
    assert!(!pipes_into_early_exit("check || grep -q x file"));
    assert!(!pipes_into_early_exit("grep -q x <<<\"$text\""));
    assert!(!pipes_into_early_exit("# a | grep -q in a comment"));
    assert!(pipes_into_early_exit("pid=$(pgrep x | head -n 1)"));
    assert!(!pipes_into_early_exit("pid=$(pgrep x | sed -n 1p)"));
    assert!(!pipes_into_early_exit("a | header"));
}

#[test]
fn no_script_under_pipefail_pipes_into_a_reader_that_stops_early() {
    let scripts = scripts();
    assert!(
        scripts.len() > 5,
        "found only {scripts:?}: the walk is broken"
    );
    let mut offenders = Vec::new();
    for path in &scripts {
        // Every one: those without `set -o pipefail` of their own are
        // sourced by scripts with it (scripts/cluster/*.sh).
        let text = std::fs::read_to_string(path).expect("read script");
        for (n, line) in text.lines().enumerate() {
            if pipes_into_early_exit(line) {
                offenders.push(format!("{}:{}: {}", path.display(), n + 1, line.trim()));
            }
        }
    }
    assert!(
        offenders.is_empty(),
        "pipes into grep -q or head under pipefail (use `grep X >/dev/null`, `sed -n 1p`):\n{}",
        offenders.join("\n")
    );
}
