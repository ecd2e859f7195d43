//! One thread's ADD+DEL cycles with each method, checked outside the
//! timings when asked.

use super::*;

/// A thread's tools for cycles: it lives in the sandbox host namespace
/// (so host-device, which moves devices back to its own namespace, works
/// as under a runtime there) and has its own runtime and host socket for
/// the floor.
pub(super) struct Worker<'a> {
    ctx: &'a Ctx,
    rt: tokio::runtime::Runtime,
    floor: Floor,
    /// Idle time before each timed operation (see `latency`).
    pub(super) gap: Duration,
}

/// One ADD+DEL cycle's two latencies.
type Cycle = (Duration, Duration);

impl<'a> Worker<'a> {
    /// Call only on a thread made for it: it moves the thread into the
    /// sandbox host namespace for good.
    pub(super) fn on_this_thread(ctx: &'a Ctx) -> R<Worker<'a>> {
        enter(&Netns::open(&ctx.sb.host_path())?)?;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let floor = rt.block_on(Floor::new(&ctx.sb.host_path()))?;
        Ok(Worker {
            ctx,
            rt,
            floor,
            gap: Duration::ZERO,
        })
    }

    /// ADD then DEL with `method`, in pod `slot` (and, for host-device and
    /// the floor, ENI `slot`; enim picks its own). `verify` checks the pod
    /// after each step, outside the timings.
    pub(super) fn cycle(&self, method: Method, slot: usize, cid: &str, verify: bool) -> R<Cycle> {
        let ctx = self.ctx;
        let pod = ctx.main.pods[slot].as_path();
        let eni = &ctx.main.enis[slot];
        let call = |plugin, command, conf| pod_call(ctx, plugin, command, cid, pod, conf);
        let hd_conf;
        let enim_conf = ctx.enim_confs.of(method);
        std::thread::sleep(self.gap);
        let host_path = HostPathFloor::of(slot);
        let add = match method {
            Method::Enim | Method::EnimNoFsync | Method::EnimHostPath => {
                let out = exec(&call(&ctx.bins.enim, "ADD", enim_conf))?;
                out.result("enim ADD")?
                    .ok_or("enim ADD printed no result")?;
                out.elapsed
            }
            Method::HostDevice => {
                hd_conf = ctx.hd_conf(eni);
                let out = exec(&call(&ctx.bins.host_device, "ADD", &hd_conf))?;
                out.result("host-device ADD")?;
                out.elapsed
            }
            Method::Floor => {
                let t = Instant::now();
                self.rt.block_on(self.floor.add(
                    &eni.host_name,
                    pod,
                    "eth0",
                    eni.ipv4,
                    eni.gateway4,
                ))?;
                t.elapsed()
            }
            Method::FloorHostPath => {
                let t = Instant::now();
                self.rt.block_on(async {
                    let f = &self.floor;
                    f.add(&eni.host_name, pod, "eth0", eni.ipv4, eni.gateway4)
                        .await?;
                    f.add_host_path(pod, &host_path, eni.ipv4.addr()).await
                })?;
                t.elapsed()
            }
        };
        if verify {
            self.verify_added(method, slot)?;
        }
        std::thread::sleep(self.gap);
        let del = match method {
            Method::Enim | Method::EnimNoFsync | Method::EnimHostPath => {
                let out = exec(&call(&ctx.bins.enim, "DEL", enim_conf))?;
                out.result("enim DEL")?;
                out.elapsed
            }
            Method::HostDevice => {
                let conf = ctx.hd_conf(eni);
                let out = exec(&call(&ctx.bins.host_device, "DEL", &conf))?;
                out.result("host-device DEL")?;
                out.elapsed
            }
            Method::Floor => {
                let t = Instant::now();
                self.rt
                    .block_on(self.floor.del(pod, "eth0", &eni.host_name))?;
                t.elapsed()
            }
            Method::FloorHostPath => {
                let t = Instant::now();
                self.rt
                    .block_on(self.floor.del(pod, "eth0", &eni.host_name))?;
                let elapsed = t.elapsed();
                // enim deletes the host path's veth behind its answer
                // (docs/architecture.md, "The host path"); the floor does
                // it after its timing, before the next operation.
                self.rt.block_on(self.floor.del_host_path(&host_path))?;
                elapsed
            }
        };
        if verify {
            self.verify_deleted(method, slot)?;
        }
        Ok((add, del))
    }

    fn verify_added(&self, method: Method, slot: usize) -> R<()> {
        let pod = &self.ctx.main.pods[slot];
        let iface = self
            .rt
            .block_on(floor::pod_iface(pod, "eth0"))?
            .ok_or_else(|| format!("{}: no eth0 in {} after ADD", method.name(), pod.display()))?;
        let ok_addr = match method {
            // enim picks the ENI: any of the sandbox's addresses will do.
            Method::Enim | Method::EnimNoFsync => iface.addrs.iter().any(|a| {
                self.ctx
                    .main
                    .enis
                    .iter()
                    .any(|e| ipnet::IpNet::V4(e.ipv4) == *a)
            }),
            _ => iface
                .addrs
                .contains(&ipnet::IpNet::V4(self.ctx.main.enis[slot].ipv4)),
        };
        if !iface.up || !ok_addr {
            return Err(format!(
                "{}: eth0 in {} after ADD: up={} addrs={:?}",
                method.name(),
                pod.display(),
                iface.up,
                iface.addrs
            )
            .into());
        }
        Ok(())
    }

    fn verify_deleted(&self, method: Method, slot: usize) -> R<()> {
        let pod = &self.ctx.main.pods[slot];
        if self.rt.block_on(floor::pod_iface(pod, "eth0"))?.is_some() {
            return Err(format!(
                "{}: eth0 still in {} after DEL",
                method.name(),
                pod.display()
            )
            .into());
        }
        if !method.is_enim() {
            let name = &self.ctx.main.enis[slot].host_name;
            if !self
                .rt
                .block_on(floor::has_link(self.floor.host_handle(), name))?
            {
                return Err(format!("{}: {name} is not home after DEL", method.name()).into());
            }
        }
        Ok(())
    }
}

/// A plugin call for the pod interface `eth0` in `pod`.
fn pod_call<'c>(
    ctx: &'c Ctx,
    plugin: &'c Path,
    command: &'c str,
    cid: &'c str,
    pod: &'c Path,
    conf: &'c [u8],
) -> Call<'c> {
    Call {
        plugin,
        command,
        container_id: cid,
        netns: Some(pod),
        ifname: "eth0",
        cni_path: &ctx.bins.cni_path,
        conf,
    }
}
