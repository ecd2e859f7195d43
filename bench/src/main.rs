//! enim-bench: measures enim against Debian's reference `host-device`
//! plugin (with `static` IPAM) and against the kernel floor, in the same
//! run and interleaved, in a sandbox of its own namespaces. Run it through
//! `scripts/bench.sh`, which builds the binaries and cleans up after it.
//!
//! ```text
//! enim-bench --bin-dir DIR [--smoke] [--cycles N] [--rss-cycles N]
//!            [--rss-workers N] [--only PHASE,...] [--gap-ms N] [--json FILE]
//!            [--tag TAG] [--work DIR] [--cni-path DIR] [--seed N]
//! ```
//!
//! `--only` runs just the named phases (of `phases::PHASES`); the figures
//! of the others show as not run. The `burst` and `fleet` phases simulate
//! a cloud (`sim`); run alone they need no root and set up no sandbox.
//! `--seed` seeds them (default 1).

mod agent;
mod exec;
mod floor;
mod heap;
mod phases;
mod report;
mod sandbox;
mod sim;
mod stats;

use std::path::PathBuf;
use std::process::ExitCode;

/// Counts the heap, for the operator simulation's memory figure.
#[global_allocator]
static HEAP: heap::Counting = heap::Counting;

pub type R<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// The command line, one field an option: clap reads its flags, defaults
/// and help from here.
#[derive(Debug, Clone, clap::Parser)]
#[command(
    name = "enim-bench",
    about = "enim against host-device and the kernel floor (run it through scripts/bench.sh)"
)]
pub struct Opts {
    /// Where enimd, enim and enimctl are.
    #[arg(long, value_name = "DIR")]
    pub bin_dir: PathBuf,
    /// The reference plugins (host-device, static).
    #[arg(long, value_name = "DIR", default_value = "/usr/lib/cni")]
    pub cni_path: PathBuf,
    /// Namespace names are "<tag>-<what><i>": 1 to 24 ASCII letters or
    /// digits.
    #[arg(long, value_name = "TAG", default_value_t = format!("enimb{}", std::process::id()))]
    pub tag: String,
    /// The sandbox's scratch dir (default: a temporary one).
    #[arg(long, value_name = "DIR")]
    pub work: Option<PathBuf>,
    /// Every figure as JSON, written here.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// A few cycles of everything: does it work, not a measurement.
    #[arg(long)]
    pub smoke: bool,
    /// Cycles a method (0: 60 with --smoke, else 200).
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub cycles: usize,
    /// enim cycles before the last RSS sample (0: the mode's default).
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub rss_cycles: usize,
    /// Pods in parallel in the memory phase.
    #[arg(long, value_name = "N", default_value_t = phases::MAIN_ENIS)]
    pub rss_workers: usize,
    /// Phases to run (empty: all).
    #[arg(long, value_name = "PHASE,...", value_delimiter = ',', value_parser = phase_name)]
    pub only: Vec<String>,
    /// Idle time before each timed latency operation (None: the default).
    #[arg(long, value_name = "N")]
    pub gap_ms: Option<u64>,
    /// Seed of the simulations.
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub seed: u64,
}

impl Opts {
    pub fn runs(&self, phase: &str) -> bool {
        self.only.is_empty() || self.only.iter().any(|p| p == phase)
    }

    /// Only simulations were picked: no root, no sandbox.
    pub fn sim_only(&self) -> bool {
        !self.only.is_empty() && self.only.iter().all(|p| sim::PHASES.contains(&p.as_str()))
    }
}

/// One of `--only`'s phases, trimmed.
fn phase_name(p: &str) -> Result<String, String> {
    let p = p.trim();
    if phases::PHASES.contains(&p) {
        Ok(p.to_string())
    } else {
        Err(format!(
            "unknown phase {p:?} (phases: {})",
            phases::PHASES.join(",")
        ))
    }
}

/// The command line, checked beyond what clap checks.
fn parse_args() -> Result<Opts, String> {
    let mut o = <Opts as clap::Parser>::parse();
    // Namespace names are "<tag>-<what><i>"; keep them short and plain.
    if o.tag.is_empty() || o.tag.len() > 24 || !o.tag.chars().all(|c| c.is_ascii_alphanumeric()) {
        return Err("--tag must be 1 to 24 ASCII letters or digits".into());
    }
    if !(1..=phases::MAIN_ENIS).contains(&o.rss_workers) {
        return Err(format!("--rss-workers must be 1 to {}", phases::MAIN_ENIS));
    }
    if o.cycles == 0 {
        // The smoke's latency phase feeds the slide guard: enough cycles
        // for a mean, a few seconds of the run.
        o.cycles = if o.smoke { 60 } else { 200 };
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
    if !opts.sim_only() && !nix::unistd::geteuid().is_root() {
        eprintln!("enim-bench: must run as root: it creates network namespaces");
        return ExitCode::from(2);
    }
    match run(&opts) {
        Ok((markdown, json)) => {
            print!("{markdown}");
            if let Some(path) = &opts.json {
                let written = serde_json::to_vec_pretty(&json)
                    .map_err(|e| e.to_string())
                    .and_then(|b| std::fs::write(path, b).map_err(|e| e.to_string()));
                if let Err(e) = written {
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

/// The simulations, then (unless only they were picked) the sandbox
/// phases; the report and the JSON of both.
fn run(opts: &Opts) -> R<(String, serde_json::Value)> {
    let sim = sim::run(opts)?;
    if opts.sim_only() {
        let mode = if opts.smoke {
            "smoke (not a measurement)"
        } else {
            "full"
        };
        let md = format!(
            "\n## enim benchmark: {mode}; simulations only ({})\n{}",
            opts.only.join(", "),
            sim::markdown(&sim)
        );
        let json = serde_json::json!({
            "schema": "enim-bench/1",
            "mode": if opts.smoke { "smoke" } else { "full" },
            "simulation": sim::json(&sim),
        });
        return Ok((md, json));
    }
    let results = phases::run(opts)?;
    let md = format!("{}{}", report::markdown(&results), sim::markdown(&sim));
    let mut json = report::json(&results);
    if let Some(o) = json.as_object_mut() {
        o.insert("simulation".into(), sim::json(&sim));
    }
    // The slide guard, when the latency phase ran: past it, the run fails
    // (after its figures are printed), and so does CI's smoke run.
    let slid: Vec<String> = match opts.runs("latency") {
        true => report::guard(&results)
            .into_iter()
            .filter(|t| !t.met)
            .map(|t| format!("{} = {:.2} × (limit {} ×)", t.name, t.value, t.limit))
            .collect(),
        false => Vec::new(),
    };
    if !slid.is_empty() {
        print!("{md}");
        return Err(format!(
            "the slide guard failed: {} (ADD or DEL slid from the kernel floor; the figures are above)",
            slid.join("; ")
        )
        .into());
    }
    Ok((md, json))
}
