//! Randomised soak: seeded, reproducible, bounded. Hundreds of random ADD,
//! DEL, GC, pod-netns deletion and agent restart (clean and SIGKILL) events
//! over 8 ENIs and 10 pod slots, with the no-leak invariant checked at each
//! quiet point. `SOAK_SEED` and `SOAK_EVENTS` override the defaults.

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
fn randomised_soak_leaks_nothing() {
    require_kernel!();
    let seed: u64 = std::env::var("SOAK_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20261121);
    let events: usize = std::env::var("SOAK_EVENTS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(300);
    let budget = Duration::from_secs(170);
    eprintln!("soak: seed {seed}, {events} events (SOAK_SEED / SOAK_EVENTS to change)");
    let mut rng = SmallRng::seed_from_u64(seed);

    let sb = Sandbox::new(ENIS);
    let dir = tempfile::tempdir().unwrap();
    let mut agent = start_agent(&sb, dir.path(), "gc_grace = \"0s\"");
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
        let ctx = format!("seed {seed} event {event}");
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
                    if let Some(i) = held {
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
        assert_invariant(&sb, &pods, &agent, &[], &ctx);
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
    eprintln!(
        "soak: {done} events in {:?}: {} ADD, {} DEL, {} GC, {} pod deaths, {} restarts",
        started.elapsed(),
        counts[0],
        counts[1],
        counts[2],
        counts[3],
        counts[4]
    );
}
