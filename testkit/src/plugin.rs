//! The `enim` plugin binary for tests outside its package. The plugin is
//! `enim-cni`'s binary, and cargo builds a package's binaries only for that
//! package's own tests (`CARGO_BIN_EXE_*`); the enim crate's tests, which
//! run it against a real enimd, get it from [`built_beside`]: a
//! `cargo build` of it into enimd's target directory and profile, once per
//! test process. Cargo makes that a no-op when the binary is current and
//! rebuilds it when its code changed, so a test never runs a stale plugin.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The plugin's package and binary.
const PACKAGE: &str = "enim-cni";
const BINARY: &str = "enim";

/// The `enim` plugin built beside `enimd` (`<target>/<profile>/enim`, where
/// `enimd install-cni` also looks for it). Panics with cargo's output when
/// the build fails.
pub fn built_beside(enimd: &Path) -> PathBuf {
    static BUILT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    BUILT
        .get_or_init(|| build(enimd))
        .clone()
        .unwrap_or_else(|e| panic!("building the {BINARY} plugin ({PACKAGE}): {e}"))
}

fn build(enimd: &Path) -> Result<PathBuf, String> {
    let profile_dir = enimd
        .parent()
        .ok_or_else(|| format!("{} has no directory", enimd.display()))?;
    let target_dir = profile_dir
        .parent()
        .ok_or_else(|| format!("{} has no target directory", profile_dir.display()))?;
    // Cargo's `dev` profile builds into `debug`; every other into its name.
    let profile = match profile_dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") => "dev",
        Some(name) => name,
        None => return Err(format!("{} names no profile", profile_dir.display())),
    };
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("testkit lives in the workspace")
        .join("Cargo.toml");
    // The cargo that runs the test (it sets CARGO), else this crate's.
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| env!("CARGO").into());
    let mut cmd = Command::new(&cargo);
    cmd.args([
        "build",
        "--quiet",
        "--profile",
        profile,
        "--package",
        PACKAGE,
    ])
    .args(["--bin", BINARY, "--target-dir"])
    .arg(target_dir)
    .arg("--manifest-path")
    .arg(&workspace);
    as_invoking_user(&mut cmd, Path::new(&cargo));
    let out = cmd
        .output()
        .map_err(|e| format!("running {}: {e}", Path::new(&cargo).display()))?;
    if !out.status.success() {
        return Err(format!(
            "cargo build exited {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(profile_dir.join(BINARY))
}

/// Test binaries run as root through `sudo -E` when a user runs the tests
/// (scripts/cargo-runner.sh); the build must then run as that user, or it
/// would leave root-owned files in their target directory. Their toolchain
/// is found beside `cargo` (sudo resets PATH).
fn as_invoking_user(cmd: &mut Command, cargo: &Path) {
    if !nix::unistd::geteuid().is_root() {
        return;
    }
    let id = |name: &str| std::env::var(name).ok().and_then(|v| v.parse::<u32>().ok());
    let (Some(uid), Some(gid)) = (id("SUDO_UID"), id("SUDO_GID")) else {
        return;
    };
    if let Ok(Some(user)) = nix::unistd::User::from_uid(uid.into()) {
        cmd.env("HOME", user.dir);
    }
    if let Some(toolchain) = cargo.parent() {
        let mut path = OsString::from(toolchain);
        if let Some(rest) = std::env::var_os("PATH") {
            path.push(":");
            path.push(rest);
        }
        cmd.env("PATH", path);
    }
    cmd.uid(uid).gid(gid);
}
