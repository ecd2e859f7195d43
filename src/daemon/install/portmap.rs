//! The `portmap` half of install-cni: whether the node's reference
//! `portmap` plugin can be chained after enim (hostPort is portmap's, see
//! the parent module).

use std::fmt;
use std::io::{self, Read, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::{CNI_VERSION, CNI_VERSIONS};

/// The reference plugin that serves hostPort, its file name and `type`.
pub const PORTMAP_NAME: &str = "portmap";
/// How long `auto` waits for portmap's answer to VERSION (the reference
/// plugin answers in milliseconds; a slow node gets ample margin).
pub const PORTMAP_VERSION_TIMEOUT: Duration = Duration::from_secs(5);
/// The stdin of the VERSION probe: any config version will do, the answer
/// lists them all.
const VERSION_PROBE_STDIN: &[u8] = br#"{"cniVersion":"1.0.0"}"#;
/// More than any VERSION answer; a plugin printing more is not one.
const VERSION_ANSWER_MAX: u64 = 64 << 10;

/// Whether the conflist chains `portmap` after enim (`--portmap`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum PortmapMode {
    /// When `<cni-bin-dir>/portmap` is an executable that answers VERSION
    /// with every version in the conflist's `cniVersions`.
    #[default]
    Auto,
    /// Always; an error when `<cni-bin-dir>/portmap` is not an executable
    /// file. Its versions are not checked (a runtime that reads only
    /// `cniVersion`, 1.0.0, works with an older portmap).
    Always,
    /// Never: enim alone, and hostPort does nothing.
    Never,
}

/// Why `portmap` cannot be chained.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PortmapProblem {
    Missing {
        path: PathBuf,
    },
    NotAFile {
        path: PathBuf,
    },
    NotExecutable {
        path: PathBuf,
    },
    /// Running it with `CNI_COMMAND=VERSION` gave no answer to read.
    NoVersion {
        path: PathBuf,
        detail: String,
    },
    /// It answered, without some of the conflist's `cniVersions`.
    LacksVersions {
        path: PathBuf,
        supported: Vec<String>,
        lacking: Vec<String>,
    },
}

impl fmt::Display for PortmapProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PortmapProblem::Missing { path } => write!(f, "{} does not exist", path.display()),
            PortmapProblem::NotAFile { path } => {
                write!(f, "{} is not a regular file", path.display())
            }
            PortmapProblem::NotExecutable { path } => {
                write!(f, "{} is not executable", path.display())
            }
            PortmapProblem::NoVersion { path, detail } => {
                write!(f, "{} gave no CNI VERSION answer: {detail}", path.display())
            }
            PortmapProblem::LacksVersions {
                path,
                supported,
                lacking,
            } => write!(
                f,
                "{} supports CNI {} but not {} of the conflist's cniVersions \
                 (a runtime on libcni 1.2 or later would use the newest, and every \
                 ADD would fail with \"incompatible CNI versions\"); install a newer \
                 portmap, or pass --portmap always if the runtime reads only \
                 cniVersion ({CNI_VERSION})",
                path.display(),
                supported.join(", "),
                lacking.join(", ")
            ),
        }
    }
}

/// What became of portmap in the conflist.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PortmapChoice {
    /// Chained after enim: this binary serves hostPort.
    Chained { path: PathBuf },
    /// Left out by `--portmap never`.
    Off,
    /// Left out by `auto`, for this reason: hostPort will not work.
    Unusable(PortmapProblem),
}

/// Whether `path` is an executable regular file (following symlinks, as
/// the runtime's exec does).
pub(super) fn portmap_file(path: &Path) -> Result<(), PortmapProblem> {
    let path = path.to_path_buf();
    match std::fs::metadata(&path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Err(PortmapProblem::Missing { path }),
        Err(e) => Err(PortmapProblem::NoVersion {
            detail: format!("inspecting it: {e}"),
            path,
        }),
        Ok(m) if !m.is_file() => Err(PortmapProblem::NotAFile { path }),
        Ok(m) if m.mode() & 0o111 == 0 => Err(PortmapProblem::NotExecutable { path }),
        Ok(_) => Ok(()),
    }
}

/// Runs `path` with `CNI_COMMAND=VERSION` alone in its environment and
/// returns the `supportedVersions` it answers, within `timeout`.
fn cni_supported_versions(path: &Path, timeout: Duration) -> Result<Vec<String>, String> {
    let mut child = Command::new(path)
        .env_clear()
        .env("CNI_COMMAND", "VERSION")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("running it: {e}"))?;
    if let Some(mut stdin) = child.stdin.take() {
        // A few bytes, within any pipe's buffer: this does not block. A
        // plugin that exits without reading them fails it (EPIPE); its
        // answer says more than that error.
        let _ = stdin.write_all(VERSION_PROBE_STDIN);
    }
    let mut stdout = child.stdout.take().expect("stdout is piped");
    let (tx, rx) = mpsc::channel();
    // Read in a thread, so that the wait for the end of the output has a
    // deadline (a plugin that hangs keeps its stdout open).
    std::thread::spawn(move || {
        let mut out = Vec::new();
        let read = (&mut stdout)
            .take(VERSION_ANSWER_MAX)
            .read_to_end(&mut out)
            .map(|_| out);
        let _ = tx.send(read);
    });
    let deadline = Instant::now() + timeout;
    let gave_up = |child: &mut std::process::Child| {
        let _ = child.kill();
        let _ = child.wait();
        format!("no answer within {timeout:?}")
    };
    let out = match rx.recv_timeout(timeout) {
        Ok(read) => read.map_err(|e| format!("reading its answer: {e}"))?,
        Err(_) => return Err(gave_up(&mut child)),
    };
    // Its output ended; it exits now, or is killed at the deadline.
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
            Ok(None) => return Err(gave_up(&mut child)),
            Err(e) => return Err(format!("waiting for it: {e}")),
        }
    };
    let shown = || {
        let text = String::from_utf8_lossy(&out);
        let text = text.trim();
        match text.char_indices().nth(200) {
            Some((i, _)) => format!("{}...", &text[..i]),
            None => text.to_string(),
        }
    };
    if !status.success() {
        return Err(format!("it exited with {status}: {:?}", shown()));
    }
    #[derive(serde::Deserialize)]
    struct Answer {
        #[serde(rename = "supportedVersions")]
        supported_versions: Vec<String>,
    }
    let answer: Answer = serde_json::from_slice(&out)
        .map_err(|e| format!("its answer {:?} is not a VERSION result: {e}", shown()))?;
    Ok(answer.supported_versions)
}

/// Whether the portmap at `path` can be chained: an executable regular file
/// that answers VERSION (within `timeout`) with every version in
/// [`CNI_VERSIONS`].
pub fn check_portmap(path: &Path, timeout: Duration) -> Result<(), PortmapProblem> {
    portmap_file(path)?;
    let supported =
        cni_supported_versions(path, timeout).map_err(|detail| PortmapProblem::NoVersion {
            path: path.to_path_buf(),
            detail,
        })?;
    let lacking: Vec<String> = CNI_VERSIONS
        .iter()
        .filter(|v| !supported.iter().any(|s| s == *v))
        .map(|v| v.to_string())
        .collect();
    if lacking.is_empty() {
        Ok(())
    } else {
        Err(PortmapProblem::LacksVersions {
            path: path.to_path_buf(),
            supported,
            lacking,
        })
    }
}

#[cfg(test)]
pub(super) mod tests {
    use std::os::unix::fs::PermissionsExt;

    use enim_testkit::cni::{fake_portmap, write_script};

    use super::*;

    pub(in crate::daemon::install) const NEW: &[&str] = &["0.3.1", "0.4.0", "1.0.0", "1.1.0"];
    /// Debian's containernetworking-plugins 1.1.1.
    pub(in crate::daemon::install) const OLD: &[&str] =
        &["0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0"];

    #[test]
    fn check_portmap_says_why_not() {
        let tmp = tempfile::tempdir().unwrap();
        let bin = tmp.path();
        let path = bin.join("portmap");
        let check = || check_portmap(&path, PORTMAP_VERSION_TIMEOUT);

        let missing = check().unwrap_err();
        assert_eq!(missing, PortmapProblem::Missing { path: path.clone() });
        assert!(missing.to_string().ends_with("portmap does not exist"));

        fake_portmap(bin, NEW);
        check().unwrap();

        let lacks = fake_portmap(bin, &["0.4.0"]);
        let err = check().unwrap_err();
        assert_eq!(
            err,
            PortmapProblem::LacksVersions {
                path: lacks,
                supported: vec!["0.4.0".into()],
                lacking: vec!["1.0.0".into(), "1.1.0".into()],
            }
        );
        let text = err.to_string();
        assert!(
            text.contains("supports CNI 0.4.0 but not 1.0.0, 1.1.0")
                && text.contains("incompatible CNI versions"),
            "{text}"
        );

        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert_eq!(
            check().unwrap_err(),
            PortmapProblem::NotExecutable { path: path.clone() }
        );

        // Answers that are not VERSION results.
        for (body, want) in [
            (
                "printf '{\"code\":4,\"msg\":\"broken\"}'; exit 1",
                "exited with exit status: 1",
            ),
            ("printf 'usage: portmap'", "is not a VERSION result"),
            ("printf '{\"cniVersion\":\"1.0.0\"}'", "supportedVersions"),
        ] {
            write_script(&path, &format!("#!/bin/sh\n{body}\n"));
            match check() {
                Err(PortmapProblem::NoVersion { detail, .. }) => {
                    assert!(detail.contains(want), "{body}: {detail}")
                }
                other => panic!("{body}: {other:?}"),
            }
        }
        // Not a program at all.
        write_script(&path, "\x7fELF, but not really\n");
        assert!(matches!(check(), Err(PortmapProblem::NoVersion { .. })));
    }

    #[test]
    fn a_hung_portmap_is_given_up_on_and_killed() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("portmap");
        let pid_file = tmp.path().join("pid");
        write_script(
            &path,
            &format!(
                "#!/bin/sh\necho $$ > {}\nexec /bin/sleep 60\n",
                pid_file.display()
            ),
        );
        let start = Instant::now();
        let err = check_portmap(&path, Duration::from_millis(300)).unwrap_err();
        let took = start.elapsed();
        match &err {
            PortmapProblem::NoVersion { detail, .. } => {
                assert!(detail.contains("no answer within 300ms"), "{detail}")
            }
            other => panic!("{other:?}"),
        }
        assert!(took < Duration::from_secs(5), "took {took:?}");
        // Killed and reaped: no such process any more (unless it was killed
        // before it could even say its pid).
        if let Ok(pid) = std::fs::read_to_string(&pid_file) {
            let proc = format!("/proc/{}", pid.trim());
            assert!(!Path::new(&proc).exists(), "{proc} is still there");
        }
    }
}
