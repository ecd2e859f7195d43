//! The timed ADD/DEL cycles: the interleaved latency loop and parallel
//! throughput.

use super::*;

/// Latencies of one method over the interleaved loop.
#[derive(Default)]
pub struct Lat {
    pub add: Vec<Duration>,
    pub del: Vec<Duration>,
}

/// `n` orders of `n` items (`n` even) in which each item directly follows
/// each other one exactly once: a balanced Latin square (Williams design).
/// Row 0 is 0, 1, n-1, 2, n-2, ...; row r adds r to each, modulo n.
pub(super) fn balanced_orders(n: usize) -> Vec<Vec<usize>> {
    assert!(
        n.is_multiple_of(2),
        "a Williams square needs an even number of items"
    );
    let first: Vec<usize> = (0..n)
        .map(|i| {
            if i % 2 == 1 {
                i.div_ceil(2)
            } else {
                (n - i / 2) % n
            }
        })
        .collect();
    (0..n)
        .map(|r| first.iter().map(|x| (x + r) % n).collect())
        .collect()
}

/// `cycles` interleaved ADD+DEL cycles of every method, one pod at a time.
/// Cycles go through the orders of a balanced Latin square in turn, so each
/// method directly follows each other one equally often: what an operation leaves behind
/// in the kernel must not always land on the same successor (with a fixed
/// rotation the floor's ADD measured about 5 ms slower right after
/// host-device's DEL than after enim's).
/// Each timed operation starts after `plan.gap` of idle time.
pub(super) fn latency(ctx: &Ctx, plan: &Plan) -> R<([Lat; LAT_N], Vec<Vec<usize>>)> {
    on_thread(|| {
        let mut w = Worker::on_this_thread(ctx)?;
        w.gap = plan.gap;
        for i in 0..plan.warmup {
            for m in LAT_METHODS {
                w.cycle(m, 0, &format!("warm-{}-{i}", m.key()), true)?;
            }
        }
        let orders = balanced_orders(LAT_N);
        let mut lat: [Lat; LAT_N] = Default::default();
        let mut taken = Vec::with_capacity(plan.cycles);
        for c in 0..plan.cycles {
            let order = &orders[c % orders.len()];
            for &idx in order {
                let m = LAT_METHODS[idx];
                let verify = c % plan.verify_every == 0;
                let (a, d) = w.cycle(m, 0, &format!("lat-{}-{c}", m.key()), verify)?;
                lat[idx].add.push(a);
                lat[idx].del.push(d);
            }
            taken.push(order.clone());
        }
        Ok((lat, taken))
    })
}

/// `level` workers, each in its own pod, doing `per_worker` cycles of
/// `method` at once; returns cycles done and the wall time of all of them.
pub(super) fn parallel(
    ctx: &Ctx,
    method: Method,
    level: usize,
    per_worker: usize,
    tag: &str,
) -> R<(usize, Duration)> {
    let barrier = Barrier::new(level + 1);
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..level)
            .map(|slot| {
                let barrier = &barrier;
                s.spawn(move || -> R<()> {
                    let w = Worker::on_this_thread(ctx);
                    // Everyone meets the barrier, set up or not.
                    barrier.wait();
                    let w = w?;
                    for i in 0..per_worker {
                        let cid = format!("{tag}-{}-w{slot}-{i}", method.key());
                        w.cycle(method, slot, &cid, false)?;
                    }
                    Ok(())
                })
            })
            .collect();
        barrier.wait();
        let started = Instant::now();
        let mut first_err = None;
        for w in workers {
            let r = w.join().unwrap_or_else(|_| Err("worker panicked".into()));
            if let Err(e) = r {
                first_err.get_or_insert(e);
            }
        }
        let wall = started.elapsed();
        match first_err {
            Some(e) => Err(e),
            None => Ok((level * per_worker, wall)),
        }
    })
}

/// Cycles per second at one level, per method (summed over rounds).
pub struct Throughput {
    pub level: usize,
    pub cycles: [usize; 3],
    pub wall: [Duration; 3],
}

impl Throughput {
    pub fn rate(&self, m: Method) -> f64 {
        let i = m.index();
        crate::stats::float(self.cycles[i]) / self.wall[i].as_secs_f64()
    }
}

pub(super) fn throughput(ctx: &Ctx, plan: &Plan) -> R<Vec<Throughput>> {
    let mut out = Vec::new();
    for level in plan.levels {
        let mut t = Throughput {
            level,
            cycles: [0; 3],
            wall: [Duration::ZERO; 3],
        };
        let k = plan.per_worker(level, ctx.smoke);
        for round in 0..plan.rounds {
            for j in 0..3 {
                let idx = (round + j) % 3;
                let (n, wall) =
                    parallel(ctx, METHODS[idx], level, k, &format!("p{level}r{round}"))?;
                t.cycles[idx] += n;
                t.wall[idx] += wall;
            }
        }
        out.push(t);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::balanced_orders;

    #[test]
    fn each_method_follows_each_other_once() {
        for n in [2, 4, 6] {
            let p = balanced_orders(n);
            assert_eq!(p.len(), n);
            for o in &p {
                let mut sorted = o.clone();
                sorted.sort();
                assert_eq!(sorted, (0..n).collect::<Vec<_>>(), "{o:?} is an order");
            }
            let mut follows = vec![vec![0; n]; n];
            for o in &p {
                for w in o.windows(2) {
                    follows[w[0]][w[1]] += 1;
                }
            }
            for (a, row) in follows.iter().enumerate() {
                for (b, k) in row.iter().enumerate() {
                    assert_eq!(*k, usize::from(a != b), "n={n}: {a} -> {b}");
                }
            }
        }
    }
}
