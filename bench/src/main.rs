//! enim-bench: measures enim against Debian's reference `host-device`
//! plugin (with `static` IPAM) and against the kernel floor, in the same
//! run and interleaved, in a sandbox of its own namespaces. Run it through
//! `scripts/bench.sh`, which builds the binaries and cleans up after it.
//!
//! ```text
//! enim-bench --bin-dir DIR [--smoke] [--cycles N] [--rss-cycles N]
//!            [--gap-ms N] [--only PHASES] [--json FILE] [--tag TAG] [--work DIR]
//!            [--cni-path DIR]
//! ```
//!
//! `--only gc,restore` runs just those scale scenarios (`gc` is `gc-dead`
//! and `gc-moved`), at full or `--smoke` sizes, for quick before/after
//! figures; the markdown and JSON then hold only their figures.

mod agent;
mod exec;
mod floor;
mod phases;
mod report;
mod sandbox;
mod stats;

use std::path::PathBuf;
use std::process::ExitCode;

pub type R<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

#[derive(Debug, Clone)]
pub struct Opts {
    pub bin_dir: PathBuf,
    pub cni_path: PathBuf,
    pub tag: String,
    pub work: Option<PathBuf>,
    pub json: Option<PathBuf>,
    pub smoke: bool,
    pub cycles: usize,
    /// enim cycles before the last RSS sample (0: the mode's default).
    pub rss_cycles: usize,
    /// Idle time before each timed latency operation (None: the default).
    pub gap_ms: Option<u64>,
    /// `--only`: just these scale scenarios.
    pub only: Option<Vec<phases::ScalePhase>>,
}

const USAGE: &str = "usage: enim-bench --bin-dir DIR [--smoke] [--cycles N] [--rss-cycles N] \
                     [--gap-ms N] [--only PHASES] [--json FILE] [--tag TAG] [--work DIR] \
                     [--cni-path DIR]\n\
                     --only PHASES: just these scale scenarios, comma-separated: \
                     gc-dead, gc-moved, restore (gc: both GC ones)";

fn parse_args() -> Result<Opts, String> {
    let mut o = Opts {
        bin_dir: PathBuf::new(),
        cni_path: PathBuf::from("/usr/lib/cni"),
        tag: format!("enimb{}", std::process::id()),
        work: None,
        json: None,
        smoke: false,
        cycles: 0,
        rss_cycles: 0,
        gap_ms: None,
        only: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = || args.next().ok_or(format!("{a} needs a value\n{USAGE}"));
        match a.as_str() {
            "--bin-dir" => o.bin_dir = val()?.into(),
            "--cni-path" => o.cni_path = val()?.into(),
            "--tag" => o.tag = val()?,
            "--work" => o.work = Some(val()?.into()),
            "--json" => o.json = Some(val()?.into()),
            "--cycles" => o.cycles = val()?.parse().map_err(|e| format!("--cycles: {e}"))?,
            "--rss-cycles" => {
                o.rss_cycles = val()?.parse().map_err(|e| format!("--rss-cycles: {e}"))?
            }
            "--gap-ms" => o.gap_ms = Some(val()?.parse().map_err(|e| format!("--gap-ms: {e}"))?),
            "--only" => o.only = Some(phases::ScalePhase::parse_list(&val()?)?),
            "--smoke" => o.smoke = true,
            "-h" | "--help" => return Err(USAGE.into()),
            other => return Err(format!("unknown argument {other}\n{USAGE}")),
        }
    }
    if o.bin_dir.as_os_str().is_empty() {
        return Err(format!("--bin-dir is required\n{USAGE}"));
    }
    // Namespace names are "<tag>-<what><i>"; keep them short and plain.
    if o.tag.is_empty() || o.tag.len() > 24 || !o.tag.chars().all(|c| c.is_ascii_alphanumeric()) {
        return Err("--tag must be 1 to 24 ASCII letters or digits".into());
    }
    if o.cycles == 0 {
        o.cycles = if o.smoke { 3 } else { 200 };
    }
    if !o.smoke && o.cycles < 100 {
        return Err(
            "--cycles must be at least 100 (p99 needs them); use --smoke for a quick check".into(),
        );
    }
    Ok(o)
}

fn main() -> ExitCode {
    let opts = match parse_args() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    if !nix::unistd::geteuid().is_root() {
        eprintln!("enim-bench: must run as root: it creates network namespaces");
        return ExitCode::from(2);
    }
    let run = match &opts.only {
        Some(only) => phases::run_only(&opts, only)
            .map(|r| (report::markdown_only(&r), report::json_only(&r))),
        None => phases::run(&opts).map(|r| (report::markdown(&r), report::json(&r))),
    };
    match run {
        Ok((markdown, json)) => {
            print!("{markdown}");
            if let Some(path) = &opts.json {
                if let Err(e) = std::fs::write(path, serde_json::to_vec_pretty(&json).unwrap()) {
                    eprintln!("enim-bench: writing {}: {e}", path.display());
                    return ExitCode::FAILURE;
                }
                eprintln!("enim-bench: every figure is in {}", path.display());
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("enim-bench: FAILED: {e}");
            ExitCode::FAILURE
        }
    }
}
