//! The measurements, in the order they run: set-up, process start, API
//! round trip, interleaved ADD/DEL latency, parallel throughput, memory
//! after many cycles, then the scale scenarios with their own agents.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::sync::Barrier;
use std::time::{Duration, Instant};

use enim::netlink::Netns;
use enim_api::model::now_ms;
use enim_api::{GcReport, GcRequest, Status, ROUTE_GC, ROUTE_STATUS};
use enim_core::MacAddr;
use ipnet::Ipv4Net;
use serde_json::json;

use crate::agent::{self, Enimd, Mem, NETWORK};
use crate::exec::{exec, Bins, Call};
use crate::floor::{self, Floor, HostPathFloor};
use crate::sandbox::{enter, netns_path, Eni, Sandbox, SERVICE_CIDR};
use crate::stats::{summarize, Summary};
use crate::{Opts, R};

mod cycles;
mod scale;
mod worker;

pub use cycles::Throughput;
use cycles::{latency, parallel, throughput};
pub use scale::Scale;
use scale::{gc_dead, gc_moved, restore, timed_phase};
use worker::Worker;

/// The ways of doing the same ADD and DEL: enim as configured by default,
/// the reference plugin, the kernel floor, and (latency only) a what-if of
/// enim with its checkpoint written without fsync, and enim with the host
/// path beside the floor that also makes the veth.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    Enim,
    HostDevice,
    Floor,
    EnimNoFsync,
    EnimHostPath,
    FloorHostPath,
}

/// Compared everywhere; indices 0, 1, 2 in every per-method array (see
/// [`Method::index`]).
pub const METHODS: [Method; 3] = [Method::Enim, Method::HostDevice, Method::Floor];
/// How many methods the latency loop compares.
pub const LAT_N: usize = 6;
/// Compared in the latency loop.
pub const LAT_METHODS: [Method; LAT_N] = [
    Method::Enim,
    Method::HostDevice,
    Method::Floor,
    Method::EnimNoFsync,
    Method::EnimHostPath,
    Method::FloorHostPath,
];

impl Method {
    pub fn name(self) -> &'static str {
        match self {
            Method::Enim => "enim",
            Method::HostDevice => "host-device",
            Method::Floor => "floor",
            Method::EnimNoFsync => "enim, checkpoint_fsync = false (what-if)",
            Method::EnimHostPath => "enim with host path",
            Method::FloorHostPath => "floor with host path",
        }
    }
    pub fn key(self) -> &'static str {
        match self {
            Method::Enim => "enim",
            Method::HostDevice => "host_device",
            Method::Floor => "floor",
            Method::EnimNoFsync => "enim_no_fsync",
            Method::EnimHostPath => "enim_host_path",
            Method::FloorHostPath => "floor_host_path",
        }
    }

    /// Its place in [`LAT_METHODS`] (and, for the first three, in
    /// [`METHODS`]): where its figures are in every per-method array. The
    /// variants are declared in that order.
    pub const fn index(self) -> usize {
        self as usize
    }

    fn is_enim(self) -> bool {
        matches!(
            self,
            Method::Enim | Method::EnimNoFsync | Method::EnimHostPath
        )
    }
}

/// The phases `--only` can pick, in the order they run. The main enimd's
/// start-up and idle memory are measured whatever is picked, unless only
/// the simulations (`burst`, `fleet`: `crate::sim`, no root or sandbox)
/// are picked; they run first.
pub const PHASES: [&str; 10] = [
    "burst",
    "fleet",
    "operator",
    "api",
    "latency",
    "throughput",
    "rss",
    "gc-dead",
    "gc-moved",
    "restore",
];

/// Sizes of one run; `--smoke` shrinks everything to "does it work".
struct Plan {
    cycles: usize,
    warmup: usize,
    verify_every: usize,
    levels: [usize; 3],
    rounds: usize,
    rss_cycles: usize,
    version_execs: usize,
    status_calls: usize,
    gc_dead: usize,
    gc_moved: usize,
    restore: usize,
    gc_grace_s: u64,
    gap: Duration,
}

impl Plan {
    fn new(o: &Opts) -> Plan {
        if o.smoke {
            Plan {
                cycles: o.cycles,
                warmup: 1,
                verify_every: 1,
                levels: [1, 4, 16],
                rounds: 1,
                rss_cycles: 0,
                version_execs: 3,
                status_calls: 20,
                gc_dead: 20,
                gc_moved: 3,
                restore: 200,
                gc_grace_s: 1,
                gap: Duration::ZERO,
            }
        } else {
            Plan {
                cycles: o.cycles,
                warmup: 5,
                verify_every: 25,
                levels: [1, 4, 16],
                rounds: 3,
                rss_cycles: if o.rss_cycles > 0 { o.rss_cycles } else { 1000 },
                version_execs: 200,
                status_calls: 1000,
                gc_dead: 1000,
                gc_moved: 50,
                restore: 10_000,
                gc_grace_s: 3,
                gap: Duration::from_millis(o.gap_ms.unwrap_or(DEFAULT_GAP_MS)),
            }
        }
    }

    /// Cycles per worker in one throughput round: about 20-50 cycles a
    /// round whatever the level.
    fn per_worker(&self, level: usize, smoke: bool) -> usize {
        if smoke {
            1
        } else {
            (48 / level).clamp(3, 20)
        }
    }
}

/// The main sandbox: 16 ENIs for the latency and throughput phases, 50 for
/// the GC move-back scenario, a pod namespace for each.
pub struct Ctx {
    pub sb: Sandbox,
    pub bins: Bins,
    pub main: Slots,
    pub moved: Slots,
    pub work: PathBuf,
    pub pids_file: PathBuf,
    pub enim_confs: EnimConfs,
    pub smoke: bool,
}

/// Stand-in ENIs in the sandbox host and a pod namespace for each: slot
/// `i` is ENI `i` and pod `i`.
pub struct Slots {
    pub enis: Vec<Eni>,
    pub pods: Vec<PathBuf>,
}

impl Slots {
    /// `n` ENIs of family `fam` named `<name>-NNNNN` (host name `<name>i`,
    /// peer `<peer>i`) on /24s from 10.`net_base`.0.0, and pods `<pod>i`.
    fn add(
        sb: &mut Sandbox,
        n: usize,
        fam: u8,
        name: &str,
        net_base: u8,
        peer: &str,
        pod: &str,
    ) -> R<Slots> {
        let enis: Vec<Eni> = (0..n)
            .map(|i| family(fam, i, name, name, net_base))
            .collect();
        sb.add_enis(&enis, peer)?;
        let pods = sb.add_pods(pod, n)?;
        Ok(Slots {
            enis,
            pods: pods.iter().map(|p| netns_path(p)).collect(),
        })
    }
}

/// The plugin's network config for each enim agent of the latency loop
/// (each has its own socket).
pub struct EnimConfs {
    pub main: Vec<u8>,
    pub no_fsync: Vec<u8>,
    pub host_path: Vec<u8>,
}

impl EnimConfs {
    /// The config of the agent `method` talks to (the main one for all but
    /// the what-ifs).
    fn of(&self, method: Method) -> &[u8] {
        match method {
            Method::EnimNoFsync => &self.no_fsync,
            Method::EnimHostPath => &self.host_path,
            _ => &self.main,
        }
    }
}

pub const MAIN_ENIS: usize = 16;

/// Idle time before each timed operation of the latency loop (`--gap-ms`).
/// None by default: operations run back to back, as on a busy node, each
/// inheriting the kernel's pending RCU work of the one before (balanced
/// over predecessors, see `latency`). With idle gaps the in-process floor's
/// netns move gets several ms faster while an exec'd plugin's does not,
/// which `--gap-ms 60` shows.
pub const DEFAULT_GAP_MS: u64 = 0;

fn eni(id: String, host_name: String, mac: [u8; 6], net: [u8; 3]) -> Eni {
    Eni {
        id,
        host_name,
        mac: MacAddr(mac),
        ipv4: Ipv4Net::new(Ipv4Addr::new(net[0], net[1], net[2], 10), 24).expect("/24"),
        gateway4: Ipv4Addr::new(net[0], net[1], net[2], 1),
    }
}

/// Stand-in ENI i of a family: distinct MACs and /24s per family.
fn family(fam: u8, i: usize, id: &str, host: &str, net_base: u8) -> Eni {
    let [.., hi, lo] = u32::try_from(i)
        .expect("fewer than 2^32 ENIs")
        .to_be_bytes();
    eni(
        format!("{id}-{i:05}"),
        format!("{host}{i}"),
        [0x02, 0xe1, 0xde, fam, hi, lo],
        [10, net_base + hi, lo],
    )
}

impl Ctx {
    /// Writes an enimd config in `dir` for `enis` in the sandbox host,
    /// `extra` added to its top-level table.
    fn write_config(&self, dir: &Path, enis: &[Eni], extra: &str) -> R<()> {
        agent::write_config(dir, &self.sb.host_path(), enis, extra)
    }

    /// Starts enimd on `dir`'s config (listed for clean-up) and waits up to
    /// `timeout` for it to be ready.
    fn enimd(&self, dir: &Path, timeout: Duration) -> R<Enimd> {
        Enimd::start(&self.bins.enimd, dir, &self.pids_file, timeout)
    }

    fn new(o: &Opts, plan: &Plan, work: PathBuf) -> R<Ctx> {
        let bins = Bins {
            enim: o.bin_dir.join("enim"),
            enimd: o.bin_dir.join("enimd"),
            host_device: o.cni_path.join("host-device"),
            cni_path: o.cni_path.clone(),
        };
        for b in [
            &bins.enim,
            &bins.enimd,
            &bins.host_device,
            &o.cni_path.join("static"),
        ] {
            if !b.exists() {
                return Err(format!("{} is missing (host-device and static come from Debian's containernetworking-plugins)", b.display()).into());
            }
        }
        let mut sb = Sandbox::new(&o.tag)?;
        let main = Slots::add(&mut sb, MAIN_ENIS, 0, "eni", 77, "gw", "pod")?;
        let moved = Slots::add(&mut sb, plan.gc_moved, 1, "mb", 78, "mbp", "mbpod")?;
        let pids_file = work.join("enimd.pids");
        let conf = |agent: &str| {
            serde_json::to_vec(&json!({
                "cniVersion": "1.1.0",
                "name": NETWORK,
                "type": "enim",
                "socket": work.join(agent).join("enimd.sock"),
                "timeoutSeconds": 20,
            }))
        };
        let enim_confs = EnimConfs {
            main: conf("main")?,
            no_fsync: conf("no-fsync")?,
            host_path: conf("host-path")?,
        };
        Ok(Ctx {
            sb,
            bins,
            main,
            moved,
            work,
            pids_file,
            enim_confs,
            smoke: o.smoke,
        })
    }

    fn hd_conf(&self, e: &Eni) -> Vec<u8> {
        serde_json::to_vec(&json!({
            "cniVersion": "1.0.0",
            "name": "hd-bench",
            "type": "host-device",
            "device": e.host_name,
            "ipam": {
                "type": "static",
                "addresses": [{"address": e.ipv4.to_string(), "gateway": e.gateway4.to_string()}],
                "routes": [{"dst": "0.0.0.0/0", "gw": e.gateway4.to_string()}],
            },
        }))
        .expect("JSON")
    }
}

/// Runs `f` on a fresh thread (which may enter namespaces) and returns its
/// result.
fn on_thread<T: Send>(f: impl FnOnce() -> R<T> + Send) -> R<T> {
    std::thread::scope(|s| {
        s.spawn(f)
            .join()
            .unwrap_or_else(|_| Err("bench thread panicked".into()))
    })
}

/// Every main ENI is home under its name, none is held, nothing recorded.
fn check_all_home(ctx: &Ctx, agent: &Enimd, when: &str) -> R<()> {
    let s = agent.status()?;
    if s.attachments != 0 || s.enis_free != s.enis_total {
        return Err(format!("{when}: enimd still holds attachments: {s:?}").into());
    }
    let names = on_thread(|| {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        rt.block_on(async {
            let host = Netns::open(&ctx.sb.host_path())?;
            let h = enim::netlink::rtnl::handle_in(&host).await?;
            let links = enim::netlink::rtnl::links(&h).await?;
            R::Ok(links.into_iter().map(|l| l.name).collect::<Vec<_>>())
        })
    })?;
    for e in ctx.main.enis.iter().chain(&ctx.moved.enis) {
        if !names.contains(&e.host_name) {
            return Err(format!("{when}: {} is not home (host has {names:?})", e.host_name).into());
        }
    }
    Ok(())
}

/// enimd's memory after `cycles` enim cycles in all, taken after `after`.
pub struct RssSample {
    pub cycles: usize,
    pub after: &'static str,
    pub mem: Mem,
}

/// Every figure of one run.
pub struct Results {
    pub smoke: bool,
    pub kernel: String,
    pub cpus: usize,
    /// 1-minute load average when the run started and when it ended: the
    /// machine may be shared, and load shows in every absolute figure.
    pub load: (f64, f64),
    pub cycles: usize,
    pub lat: [(Summary, Summary); LAT_N],
    /// Every sample behind `lat`, in ms, in the order taken.
    pub lat_raw: [(Vec<f64>, Vec<f64>); LAT_N],
    /// The order of the methods (indices into `LAT_METHODS`) per cycle.
    pub lat_order: Vec<Vec<usize>>,
    pub gap_ms: u64,
    pub throughput: Vec<Throughput>,
    pub scale: Scale,
    pub startup_ms: f64,
    pub status_rt: Summary,
    pub rss_idle_kib: u64,
    pub rss_warm_kib: u64,
    pub rss_after_kib: u64,
    pub rss_cycles: usize,
    /// enimd's memory through the run.
    pub rss_series: Vec<RssSample>,
    pub version_exec: [Summary; 2],
    pub sizes: [(String, u64); 3],
}

fn loadavg() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(f64::NAN)
}

/// A progress line on stderr.
fn say(what: &str) {
    eprintln!("enim-bench: {what}");
}

pub fn run(o: &Opts) -> R<Results> {
    let plan = Plan::new(o);
    let load_start = loadavg();
    let (work, _tmp_guard) = match &o.work {
        Some(w) => (w.clone(), None),
        None => {
            let w = std::env::temp_dir().join(format!("{}-work", o.tag));
            (w.clone(), Some(RemoveDir(w)))
        }
    };
    std::fs::create_dir_all(&work)?;
    say("setting up the sandbox");
    let ctx = Ctx::new(o, &plan, work.clone())?;

    let main_dir = work.join("main");
    ctx.write_config(&main_dir, &ctx.main.enis, "")?;
    let main = ctx.enimd(&main_dir, Duration::from_secs(30))?;
    let startup_ms = main.exec_to_ready.as_secs_f64() * 1e3;
    std::thread::sleep(Duration::from_millis(200));
    let mut rss_series = Vec::new();
    let mut enim_cycles = 0;
    let mut sample = |cycles: usize, after: &'static str| -> R<u64> {
        let mem = main.mem()?;
        eprintln!(
            "enim-bench: enimd after {after} ({cycles} enim cycles): RSS {} KiB, anon {} KiB, {} threads",
            mem.rss_kib, mem.anon_kib, mem.threads
        );
        rss_series.push(RssSample { cycles, after, mem });
        Ok(mem.rss_kib)
    };
    let rss_idle_kib = sample(0, "start-up")?;

    let (version_exec, rts) = if o.runs("api") {
        say("process start (VERSION) and API round trip");
        let version_exec = version_execs(&ctx, plan.version_execs)?;
        let client = main.client(Duration::from_secs(10));
        let mut rts = Vec::with_capacity(plan.status_calls);
        for _ in 0..plan.status_calls {
            let t = Instant::now();
            let s: Status = client.get(ROUTE_STATUS)?;
            rts.push(t.elapsed());
            if !s.ready {
                return Err("main enimd is not ready".into());
            }
        }
        (version_exec, rts)
    } else {
        (version_execs(&ctx, 0)?, Vec::new())
    };

    let (lat, lat_order) = if o.runs("latency") {
        // The what-if agent over the same ENIs; the loop never lets two
        // agents hold a device at once.
        let no_fsync_dir = work.join("no-fsync");
        ctx.write_config(&no_fsync_dir, &ctx.main.enis, "checkpoint_fsync = false")?;
        let no_fsync = ctx.enimd(&no_fsync_dir, Duration::from_secs(30))?;
        let host_path_dir = work.join("host-path");
        let host_path_extra = format!("[host_path]\nservice_cidrs = [\"{SERVICE_CIDR}\"]");
        ctx.write_config(&host_path_dir, &ctx.main.enis, &host_path_extra)?;
        let host_path = ctx.enimd(&host_path_dir, Duration::from_secs(30))?;
        say(&format!(
            "latency: {} interleaved ADD+DEL cycles per method",
            plan.cycles
        ));
        let out = latency(&ctx, &plan)?;
        check_all_home(&ctx, &no_fsync, "after the latency phase (what-if agent)")?;
        no_fsync.stop()?;
        check_all_home(
            &ctx,
            &host_path,
            "after the latency phase (host path agent)",
        )?;
        host_path.stop()?;
        check_all_home(&ctx, &main, "after the latency phase")?;
        enim_cycles += plan.warmup + plan.cycles;
        out
    } else {
        Default::default()
    };
    let rss_warm_kib = sample(enim_cycles, "latency")?;

    let throughput = if o.runs("throughput") {
        say("throughput: 1, 4 and 16 pods in parallel");
        let throughput = throughput(&ctx, &plan)?;
        check_all_home(&ctx, &main, "after the throughput phase")?;
        enim_cycles += throughput.iter().map(|t| t.cycles[0]).sum::<usize>();
        sample(enim_cycles, "throughput")?;
        throughput
    } else {
        Vec::new()
    };

    if o.runs("rss") {
        if enim_cycles < plan.rss_cycles {
            say(&format!(
                "{} more enim cycles for the memory figure, {} pods in parallel",
                plan.rss_cycles - enim_cycles,
                o.rss_workers
            ));
        }
        // In steps, sampling as it goes: growth shows as a slope, warm-up as
        // a step at the start (hence the early samples when it starts cold).
        let mut step = 0;
        while enim_cycles < plan.rss_cycles {
            let next = match enim_cycles {
                0..10 => 10,
                10..100 => 100,
                n => n + 160,
            };
            let k = (next.min(plan.rss_cycles) - enim_cycles).div_ceil(o.rss_workers);
            let (n, _) = parallel(&ctx, Method::Enim, o.rss_workers, k, &format!("rss{step}"))?;
            enim_cycles += n;
            step += 1;
            sample(enim_cycles, "memory step")?;
        }
        check_all_home(&ctx, &main, "after the memory phase")?;
    }
    std::thread::sleep(Duration::from_millis(200));
    let rss_after_kib = sample(enim_cycles, "the cycles and 200 ms idle")?;
    main.stop()?;

    let gc_dead_ms = timed_phase(
        o,
        "gc-dead",
        &format!("GC of {} dead records without devices", plan.gc_dead),
        || gc_dead(&ctx, &plan),
    )?;
    let gc_moved_ms = timed_phase(
        o,
        "gc-moved",
        &format!("CNI GC of {} attachments moved back home", plan.gc_moved),
        || gc_moved(&ctx, &plan),
    )?;
    let (restore_ms, restore_logged_ms, restore_empty_ms) = if o.runs("restore") {
        say(&format!("start-up restore of {} records", plan.restore));
        restore(&ctx, &plan)?
    } else {
        (f64::NAN, None, f64::NAN)
    };

    let size = |p: &Path| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
    Ok(Results {
        smoke: o.smoke,
        kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap_or_default()
            .trim()
            .to_string(),
        cpus: std::thread::available_parallelism().map_or(0, |n| n.get()),
        load: (load_start, loadavg()),
        cycles: plan.cycles,
        lat: std::array::from_fn(|i| (summarize(&lat[i].add), summarize(&lat[i].del))),
        lat_raw: lat.map(|l| (ms(&l.add), ms(&l.del))),
        lat_order,
        gap_ms: u64::try_from(plan.gap.as_millis()).unwrap_or(u64::MAX),
        throughput,
        scale: Scale {
            gc_dead: plan.gc_dead,
            gc_dead_ms,
            gc_moved: plan.gc_moved,
            gc_moved_ms,
            restore: plan.restore,
            restore_ms,
            restore_logged_ms,
            restore_empty_ms,
        },
        startup_ms,
        status_rt: summarize(&rts),
        rss_idle_kib,
        rss_warm_kib,
        rss_after_kib,
        rss_cycles: enim_cycles,
        rss_series,
        version_exec,
        sizes: [
            ("enim".into(), size(&ctx.bins.enim)),
            ("enimd".into(), size(&ctx.bins.enimd)),
            ("host-device".into(), size(&ctx.bins.host_device)),
        ],
    })
}

fn ms(samples: &[Duration]) -> Vec<f64> {
    samples.iter().map(|d| d.as_secs_f64() * 1e3).collect()
}

/// `n` VERSION execs of enim and of host-device, alternating.
fn version_execs(ctx: &Ctx, n: usize) -> R<[Summary; 2]> {
    let conf = br#"{"cniVersion":"1.0.0"}"#;
    let mut t: [Vec<Duration>; 2] = Default::default();
    for i in 0..n {
        for j in 0..2 {
            let idx = (i + j) % 2;
            let plugin = if idx == 0 {
                &ctx.bins.enim
            } else {
                &ctx.bins.host_device
            };
            let out = exec(&Call {
                plugin,
                command: "VERSION",
                container_id: "",
                netns: None,
                ifname: "",
                cni_path: &ctx.bins.cni_path,
                conf,
            })?;
            out.result("VERSION")?;
            t[idx].push(out.elapsed);
        }
    }
    Ok([summarize(&t[0]), summarize(&t[1])])
}

/// Removes the bench's own temporary work directory on drop.
struct RemoveDir(PathBuf);

impl Drop for RemoveDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_method_is_at_its_index_in_the_per_method_arrays() {
        for (i, m) in LAT_METHODS.iter().enumerate() {
            assert_eq!(m.index(), i, "{}", m.name());
        }
        assert_eq!(METHODS, LAT_METHODS[..METHODS.len()]);
    }
}
