//! Loopback ports for the servers the tests start (moto, etcd,
//! kube-apiserver): a free one, and whether our child really holds it.
//!
//! A port picked free is dropped before the child binds it, so another
//! test's server can take it in between. Our child then fails to bind,
//! while a readiness probe of that port is answered by the other server.
//! [`listens_on`] tells the two apart.

use std::net::TcpListener;

/// A loopback port nothing listens on now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free loopback port")
        .port()
}

/// Whether process `pid` holds the socket listening on TCP `port` of this
/// network namespace (`/proc/net/tcp`'s listening entry, found among the
/// process's fds by inode).
pub fn listens_on(pid: u32, port: u16) -> bool {
    let Ok(table) = std::fs::read_to_string("/proc/net/tcp") else {
        return false;
    };
    // sl local_address rem_address st ... inode: state 0A is LISTEN.
    let listening: Vec<String> = table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let local_port = u16::from_str_radix(f.get(1)?.rsplit(':').next()?, 16).ok()?;
            let inode = f.get(9)?;
            (local_port == port && *f.get(3)? == "0A").then(|| format!("socket:[{inode}]"))
        })
        .collect();
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    fds.flatten().any(|fd| {
        std::fs::read_link(fd.path())
            .is_ok_and(|target| listening.iter().any(|s| target.as_os_str() == s.as_str()))
    })
}

#[cfg(test)]
mod tests {
    use std::process::Command;

    use super::*;

    #[test]
    fn a_port_is_ours_only_while_we_listen_on_it() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        assert!(listens_on(std::process::id(), port));
        let mut child = Command::new("sleep").arg("5").spawn().unwrap();
        assert!(!listens_on(child.id(), port), "the child holds no socket");
        let _ = child.kill();
        let _ = child.wait();
        drop(listener);
        assert!(!listens_on(std::process::id(), port));
    }
}
