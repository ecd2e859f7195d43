//! deploy/systemd/enimd.service: what it promises (restart on failure,
//! after the network, before the container runtimes, a stop that lets
//! requests in flight finish), and that systemd accepts it as
//! scripts/install.sh installs it (`systemd-analyze verify`, which needs
//! the ExecStart binary to exist: the installed copy is real).

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::{ci, run_ok};

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// `[Section] Key` → every value it is given, in order.
fn directives(text: &str) -> BTreeMap<(String, String), Vec<String>> {
    let mut out: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    let mut section = String::new();
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = name.to_string();
            continue;
        }
        let (key, value) = line.split_once('=').expect("Key=Value");
        out.entry((section.clone(), key.trim().to_string()))
            .or_default()
            .push(value.trim().to_string());
    }
    out
}

fn words(d: &BTreeMap<(String, String), Vec<String>>, section: &str, key: &str) -> Vec<String> {
    d.get(&(section.to_string(), key.to_string()))
        .into_iter()
        .flatten()
        .flat_map(|v| v.split_whitespace().map(String::from).collect::<Vec<_>>())
        .collect()
}

#[test]
fn the_unit_restarts_orders_and_stops_as_promised() {
    let text = std::fs::read_to_string(repo().join("deploy/systemd/enimd.service")).unwrap();
    let d = directives(&text);
    let has = |section: &str, key: &str, want: &str| {
        assert!(
            words(&d, section, key).iter().any(|w| w == want),
            "[{section}] {key} lacks {want}: {:?}",
            words(&d, section, key)
        )
    };
    has("Unit", "After", "network-online.target");
    has("Unit", "Wants", "network-online.target");
    has("Unit", "Before", "containerd.service");
    has("Unit", "Before", "crio.service");
    has("Service", "Restart", "on-failure");
    has("Install", "WantedBy", "multi-user.target");
    // SIGTERM to enimd itself, which drains; SIGKILL only after the wait.
    assert_eq!(words(&d, "Service", "KillMode"), ["mixed"]);
    assert_eq!(words(&d, "Service", "KillSignal"), ["SIGTERM"]);
    // Longer than the plugin waits for a request, so every request a
    // runtime still waits for can finish.
    let stop = words(&d, "Service", "TimeoutStopSec");
    let secs: u64 = stop[0]
        .strip_suffix('s')
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("TimeoutStopSec {stop:?} is not <n>s"));
    assert!(
        Duration::from_secs(secs) > enim_cni::config::DEFAULT_TIMEOUT,
        "TimeoutStopSec {secs}s is not above the plugin's timeout"
    );
    // The paths install.sh installs by default.
    assert_eq!(
        words(&d, "Service", "ExecStart"),
        ["/usr/local/bin/enimd", "--config", "/etc/enim/enimd.toml"]
    );
}

/// `systemd-analyze verify UNIT`: its complaints, empty when it accepts the
/// unit (it exits 0 on some, such as an unknown KillMode, so its output
/// counts too). `None` when systemd-analyze is not installed.
fn verify(unit: &Path) -> Option<String> {
    let out = match Command::new("systemd-analyze")
        .arg("verify")
        .arg(unit)
        .output()
    {
        Ok(out) => out,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        Err(e) => panic!("systemd-analyze: {e}"),
    };
    let mut said = String::from_utf8_lossy(&out.stdout).into_owned();
    said.push_str(&String::from_utf8_lossy(&out.stderr));
    if !out.status.success() {
        said.push_str(&format!("\n(exit {})", out.status));
    }
    Some(said.trim().to_string())
}

#[test]
fn install_sh_installs_a_unit_systemd_accepts() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = |name: &str| -> PathBuf { tmp.path().join(name) };
    let built_enimd = Path::new(env!("CARGO_BIN_EXE_enimd"));
    // install.sh takes the plugin from the same directory.
    enim_testkit::plugin::built_beside(built_enimd);
    let bins = built_enimd.parent().unwrap();
    run_ok(
        Command::new(repo().join("scripts/install.sh"))
            .arg("--from")
            .arg(bins)
            .args(["--cni-bin-dir", dir("cni").to_str().unwrap()])
            .args(["--net-d-dir", dir("net.d").to_str().unwrap()])
            .args(["--bin-dir", dir("bin").to_str().unwrap()])
            .args(["--config-dir", dir("etc").to_str().unwrap()])
            .args(["--systemd-dir", dir("systemd").to_str().unwrap()]),
    );
    let unit = dir("systemd").join("enimd.service");
    let text = std::fs::read_to_string(&unit).unwrap();
    let d = directives(&text);
    let exec = words(&d, "Service", "ExecStart");
    let enimd = dir("bin").join("enimd");
    let config = dir("etc").join("enimd.toml");
    assert_eq!(
        exec,
        [
            enimd.to_str().unwrap(),
            "--config",
            config.to_str().unwrap()
        ],
        "the unit runs the enimd and config install.sh put there"
    );
    assert!(enimd.is_file() && config.is_file());

    let Some(said) = verify(&unit) else {
        assert!(
            !ci(),
            "CI=true but systemd-analyze is missing (Debian package systemd)"
        );
        eprintln!("SKIPPED: systemd-analyze is not installed");
        return;
    };
    assert!(said.is_empty(), "systemd-analyze verify: {said}");

    // The check can fail: the same unit with a mistake in it.
    let broken = dir("systemd").join("broken.service");
    std::fs::write(&broken, text.replace("KillMode=mixed", "KillMode=drain")).unwrap();
    let said = verify(&broken).unwrap();
    assert!(said.contains("kill mode"), "{said}");
}
