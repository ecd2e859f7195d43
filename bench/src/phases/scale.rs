//! The scale scenarios, each with its own agent: GC of many dead records,
//! GC moving many live ENIs back home, start-up restoring many records.

use super::*;

pub struct Scale {
    pub gc_dead: usize,
    pub gc_dead_ms: f64,
    pub gc_moved: usize,
    pub gc_moved_ms: f64,
    pub restore: usize,
    pub restore_ms: f64,
    pub restore_logged_ms: Option<u64>,
    pub restore_empty_ms: f64,
}

/// Runs the phase `name` when the run asks for it, announced as `title`:
/// its time in ms, or NaN when it is not run.
pub(super) fn timed_phase(
    o: &Opts,
    name: &str,
    title: &str,
    phase: impl FnOnce() -> R<f64>,
) -> R<f64> {
    if !o.runs(name) {
        return Ok(f64::NAN);
    }
    say(title);
    phase()
}

/// GC of `n` ready records whose netns paths do not exist and whose ENIs
/// have no device: the records are older than the grace period when the
/// GC route is called, so every one is collected.
pub(super) fn gc_dead(ctx: &Ctx, plan: &Plan) -> R<f64> {
    let n = plan.gc_dead;
    let dir = ctx.work.join("gc-dead");
    let enis: Vec<Eni> = (0..n).map(|i| family(2, i, "dead", "dd", 200)).collect();
    ctx.write_config(&dir, &enis, &format!("gc_grace = \"{}s\"", plan.gc_grace_s))?;
    let created = now_ms();
    let records: Vec<_> = enis
        .iter()
        .enumerate()
        .map(|(i, e)| {
            let gone = netns_path(&format!("{}-gone{i}", ctx.sb.tag));
            agent::record(e, &format!("dead-{i}"), &gone, created)
        })
        .collect::<R<_>>()?;
    agent::write_checkpoint(&dir, &records)?;
    // Young at start-up, so the start-up pass leaves them for the timed one.
    let agent = ctx.enimd(&dir, Duration::from_secs(60))?;
    let held = agent.status()?.attachments;
    if held != n {
        return Err(format!("gc-dead: enimd restored {held} of {n} records").into());
    }
    let old_at = created + plan.gc_grace_s * 1000 + 200;
    let now = now_ms();
    if now < old_at {
        std::thread::sleep(Duration::from_millis(old_at - now));
    }
    let client = agent.client(Duration::from_secs(600));
    let t = Instant::now();
    let report: GcReport = client.post(ROUTE_GC, &GcRequest::default())?;
    let ms = t.elapsed().as_secs_f64() * 1e3;
    if report.collected.len() != n || !report.errors.is_empty() {
        return Err(format!(
            "gc-dead: collected {} of {n}, errors {:?}",
            report.collected.len(),
            report.errors.iter().take(3).collect::<Vec<_>>()
        )
        .into());
    }
    let left = agent.status()?.attachments;
    if left != 0 {
        return Err(format!("gc-dead: {left} records left after GC").into());
    }
    agent.stop()?;
    Ok(ms)
}

/// CNI GC (the plugin, exec'd) whose valid-attachments list omits `n` live
/// attachments: enimd must move every ENI back home.
pub(super) fn gc_moved(ctx: &Ctx, plan: &Plan) -> R<f64> {
    let n = plan.gc_moved;
    let dir = ctx.work.join("gc-moved");
    ctx.write_config(&dir, &ctx.moved.enis, "gc_grace = \"0s\"")?;
    let agent = ctx.enimd(&dir, Duration::from_secs(30))?;
    let conf = serde_json::to_vec(&json!({
        "cniVersion": "1.1.0",
        "name": NETWORK,
        "type": "enim",
        "socket": agent.socket,
    }))?;
    for (i, pod) in ctx.moved.pods.iter().enumerate() {
        let out = exec(&Call {
            plugin: &ctx.bins.enim,
            command: "ADD",
            container_id: &format!("mb-{i}"),
            netns: Some(pod),
            ifname: "eth0",
            cni_path: &ctx.bins.cni_path,
            conf: &conf,
        })?;
        out.result("enim ADD (gc move-back set-up)")?;
    }
    let held = agent.status()?.attachments;
    if held != n {
        return Err(format!("gc-moved: {held} of {n} attachments made").into());
    }
    let mut gc_conf: serde_json::Value = serde_json::from_slice(&conf)?;
    gc_conf["cni.dev/valid-attachments"] = json!([]);
    let out = exec(&Call {
        plugin: &ctx.bins.enim,
        command: "GC",
        container_id: "",
        netns: None,
        ifname: "",
        cni_path: &ctx.bins.cni_path,
        conf: &serde_json::to_vec(&gc_conf)?,
    })?;
    out.result("enim GC")?;
    let s: Status = agent.client(Duration::from_secs(30)).get(ROUTE_STATUS)?;
    if s.attachments != 0 || s.enis_free != n {
        return Err(format!("gc-moved: after GC: {s:?}").into());
    }
    agent.stop()?;
    Ok(out.elapsed.as_secs_f64() * 1e3)
}

/// Start-up with `n` ready records (pods alive, older than the grace
/// period, so the start-up GC pass checks every one) and `n` ENIs; and,
/// for comparison, the same config with no records.
pub(super) fn restore(ctx: &Ctx, plan: &Plan) -> R<(f64, Option<u64>, f64)> {
    let n = plan.restore;
    let enis: Vec<Eni> = (0..n).map(|i| family(3, i, "rs", "rs", 100)).collect();
    let empty = ctx.work.join("restore-empty");
    ctx.write_config(&empty, &enis, "")?;
    let agent = ctx.enimd(&empty, Duration::from_secs(60))?;
    let empty_ms = agent.exec_to_ready.as_secs_f64() * 1e3;
    agent.stop()?;

    let dir = ctx.work.join("restore");
    ctx.write_config(&dir, &enis, "")?;
    let hour_ago = now_ms() - 3_600_000;
    let live = &ctx.main.pods[0];
    let records: Vec<_> = enis
        .iter()
        .enumerate()
        .map(|(i, e)| agent::record(e, &format!("rs-{i}"), live, hour_ago))
        .collect::<R<_>>()?;
    agent::write_checkpoint(&dir, &records)?;
    let agent = ctx.enimd(&dir, Duration::from_secs(120))?;
    let ms = agent.exec_to_ready.as_secs_f64() * 1e3;
    let s = agent.status()?;
    if s.attachments != n {
        return Err(format!("restore: {} of {n} records after start-up", s.attachments).into());
    }
    let logged = agent.logged_restore_ms();
    agent.stop()?;
    Ok((ms, logged, empty_ms))
}
