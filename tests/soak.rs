//! Randomised soak, in both modes: seeded, reproducible, bounded. Hundreds
//! of random ADD, DEL, GC, pod-netns deletion and agent restart (clean and
//! SIGKILL) events over 10 pod slots, with the no-leak invariant checked at
//! each quiet point: 8 whole ENIs in primary mode, 4 ENIs of 2 secondary
//! addresses in secondary mode (so both run full). `SOAK_SEED` and
//! `SOAK_EVENTS` override the defaults.

mod common;

use std::time::{Duration, Instant};

use common::*;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

const ENIS: usize = 8;
const SLOTS: usize = 10;

struct Slot {
    netns: Option<NamedNetns>,
    generation: u32,
    attached: bool,
}

impl Slot {
    fn cid(&self, i: usize) -> String {
        format!("soak{i}g{}", self.generation)
    }
}

#[test]
fn randomised_soak_leaks_nothing_primary() {
    require_kernel!();
    soak(false);
}

#[test]
fn randomised_soak_leaks_nothing_secondary() {
    require_kernel!();
    soak(true);
}

fn soak(secondary: bool) {
    let seed: u64 = std::env::var("SOAK_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20261121);
    let events: usize = std::env::var("SOAK_EVENTS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(300);
    let budget = Duration::from_secs(170);
    let mode = if secondary { "secondary" } else { "primary" };
    eprintln!("soak ({mode}): seed {seed}, {events} events (SOAK_SEED / SOAK_EVENTS to change)");
    let mut rng = SmallRng::seed_from_u64(seed);

    let mut sb = Sandbox::new(ENIS);
    let mut config = String::from("gc_grace = \"0s\"");
    if secondary {
        sb.enis = sb.enis_with_secondaries(&[2, 2, 2, 2, 0, 0, 0, 0], false);
        config.push_str("\nmode = \"secondary\"\n[secondary]\ncooldown = \"0s\"");
    }
    let dir = tempfile::tempdir().unwrap();
    let mut agent = start_agent(&sb, dir.path(), &config);
    let clean = sb.host_state();
    let conf = agent.net_conf("1.1.0");
    let mut slots: Vec<Slot> = (0..SLOTS)
        .map(|_| Slot {
            netns: None,
            generation: 0,
            attached: false,
        })
        .collect();
    let started = Instant::now();
    let mut counts = [0usize; 5];

    let mut done = 0;
    for event in 0..events {
        // Bounded in time: a slow machine runs fewer events, not forever.
        if started.elapsed() > budget {
            eprintln!("soak: time budget reached after {event} events");
            break;
        }
        done = event + 1;
        let s = rng.random_range(0..SLOTS);
        let what = match rng.random_range(0..100) {
            0..=39 => 0,  // ADD
            40..=69 => 1, // DEL
            70..=79 => 2, // GC
            80..=91 => 3, // pod dies without DEL
            _ => 4,       // agent restart
        };
        counts[what] += 1;
        let ctx = format!("{mode}: seed {seed} event {event}");
        match what {
            0 => {
                let slot = &mut slots[s];
                let cid = slot.cid(s);
                let netns = slot.netns.get_or_insert_with(|| NamedNetns::new("soak"));
                let out = enim("ADD", &cid, Some(&netns.path()), "eth0", &conf);
                if out.status == 0 {
                    slot.attached = true;
                } else {
                    // Only exhaustion may refuse an ADD here.
                    out.err(11);
                    assert!(
                        !slot.attached,
                        "{ctx}: ADD of an attached slot failed: {out:?}"
                    );
                }
            }
            1 => {
                let slot = &mut slots[s];
                let path = slot.netns.as_ref().map(|n| n.path());
                enim("DEL", &slot.cid(s), path.as_deref(), "eth0", &conf).ok();
                slot.attached = false;
                slot.generation += 1; // the runtime's next sandbox is a new container
            }
            2 => {
                agent.ctl(&["gc"]);
            }
            3 => {
                let slot = &mut slots[s];
                if let Some(netns) = slot.netns.take() {
                    let held = sb
                        .enis
                        .iter()
                        .position(|e| netns.link_by_mac(e.mac).is_some());
                    drop(netns);
                    // A veth ENI dies with its netns; a physical one would
                    // come back to the host. Model the physical case.
                    // (Secondary mode: the pod's veth dies with it.)
                    if let Some(i) = held.filter(|_| !secondary) {
                        sb.plug_eni(i);
                    }
                    slot.attached = false;
                    slot.generation += 1;
                }
            }
            _ => {
                if rng.random_bool(0.5) {
                    agent.stop();
                } else {
                    agent.kill9();
                }
                agent.restart();
            }
        }
        // Quiet point: a GC pass, then the invariant.
        agent.ctl(&["gc"]);
        let pods: Vec<&NamedNetns> = slots.iter().filter_map(|s| s.netns.as_ref()).collect();
        if secondary {
            assert_secondary_invariant(&sb, &slots, &agent, &ctx);
        } else {
            assert_invariant(&sb, &pods, &agent, &[], &ctx);
        }
        let attached = slots.iter().filter(|s| s.attached).count();
        let recorded = agent.ctl(&["attachments"])["attachments"]
            .as_array()
            .unwrap()
            .len();
        assert_eq!(attached, recorded, "{ctx}: pods attached vs records");
    }
    assert!(
        done >= events.min(100),
        "soak ran only {done} events within its budget"
    );
    // The end: every pod goes; the host is as the agent found it.
    for (i, slot) in slots.iter().enumerate() {
        let path = slot.netns.as_ref().map(|n| n.path());
        enim("DEL", &slot.cid(i), path.as_deref(), "eth0", &conf).ok();
    }
    agent.ctl(&["gc"]);
    assert_eq!(agent.attachments(), Vec::<serde_json::Value>::new());
    if secondary {
        assert_eq!(sb.host_state(), clean, "{mode}: the soak left plumbing");
    } else {
        sb.assert_all_home();
    }
    eprintln!(
        "soak ({mode}): {done} events in {:?}: {} ADD, {} DEL, {} GC, {} pod deaths, {} restarts",
        started.elapsed(),
        counts[0],
        counts[1],
        counts[2],
        counts[3],
        counts[4]
    );
}

/// Secondary mode's no-leak invariant: each attached slot's pod has its
/// interface and one record; the host holds exactly one enim veth and two
/// rules per record; no address is held twice.
fn assert_secondary_invariant(sb: &Sandbox, slots: &[Slot], agent: &Agent, when: &str) {
    let records = agent.attachments();
    let mut ips: Vec<&str> = records
        .iter()
        .map(|r| r["ipv4"].as_str().expect("an IPv4 address"))
        .collect();
    ips.sort_unstable();
    let before = ips.len();
    ips.dedup();
    assert_eq!(
        before,
        ips.len(),
        "{when}: an address is held twice: {records:?}"
    );
    for slot in slots.iter().filter(|s| s.attached) {
        let netns = slot.netns.as_ref().expect("an attached slot has a netns");
        assert!(
            netns.link("eth0").is_some(),
            "{when}: an attached pod lost eth0"
        );
    }
    let veths: Vec<String> = sb
        .host
        .link_names()
        .into_iter()
        .filter(|n| n.len() == 15 && n.starts_with("enim"))
        .collect();
    assert_eq!(
        veths.len(),
        records.len(),
        "{when}: host veths {veths:?} vs {records:?}"
    );
    let rules = sb.host.ip(&["-4", "rule", "list"]);
    let pod_rules = rules
        .lines()
        .filter(|l| l.starts_with("512:") || l.starts_with("1536:"))
        .count();
    assert_eq!(pod_rules, 2 * records.len(), "{when}: rules:\n{rules}");
}
