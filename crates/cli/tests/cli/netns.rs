//! Network namespaces of a test's own, joined by veth pairs: hosts for tests of what crosses a
//! network (the ssh start, MPTCP over two paths). Everything is removed when dropped, also
//! when the test fails: processes still running in the namespaces are killed, then the
//! namespaces are deleted, and their veth pairs with them. The addresses are private and live
//! only inside the test's namespaces, so they cannot collide with anything.

use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::common::is_root;

/// Runs `ip ARGS...`, asserting success.
pub fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("run ip");
    assert!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A test's network namespaces.
pub struct Namespaces {
    tag: String,
    names: Vec<String>,
}

impl Namespaces {
    /// `count` new namespaces with loopback up; `None` (with the reason printed) when not
    /// root, as namespaces need it. `what` names the test in that message.
    pub fn new(count: usize, what: &str) -> Option<Namespaces> {
        if !is_root() {
            eprintln!("not root: skipping {what} (it needs network namespaces)");
            return None;
        }
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let tag = format!(
            "xn{}n{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let mut namespaces = Namespaces {
            tag,
            names: Vec::new(),
        };
        for i in 0..count {
            let name = format!("{}h{i}", namespaces.tag);
            ip(&["netns", "add", &name]);
            namespaces.names.push(name);
            ip(&["-n", namespaces.name(i), "link", "set", "lo", "up"]);
        }
        Some(namespaces)
    }

    /// The name of namespace `i`.
    pub fn name(&self, i: usize) -> &str {
        &self.names[i]
    }

    /// A veth pair from namespace `a` to namespace `b`, numbered `n` among the test's pairs,
    /// with the address (`ADDR/PREFIX`) on each end, up. Returns the two devices' names.
    pub fn link(
        &self,
        n: usize,
        (a, addr_a): (usize, &str),
        (b, addr_b): (usize, &str),
    ) -> [String; 2] {
        let devs = [format!("{}v{n}a", self.tag), format!("{}v{n}b", self.tag)];
        ip(&[
            "link",
            "add",
            &devs[0],
            "netns",
            self.name(a),
            "type",
            "veth",
            "peer",
            &devs[1],
            "netns",
            self.name(b),
        ]);
        for (ns, dev, addr) in [(a, &devs[0], addr_a), (b, &devs[1], addr_b)] {
            ip(&["-n", self.name(ns), "addr", "add", addr, "dev", dev]);
            ip(&["-n", self.name(ns), "link", "set", dev, "up"]);
        }
        devs
    }

    /// A command that runs `program` inside namespace `i`.
    pub fn command(&self, i: usize, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", self.name(i)]).arg(program);
        cmd
    }

    /// Runs `program ARGS...` inside namespace `i`, asserting success.
    pub fn run(&self, i: usize, program: &str, args: &[&str]) {
        let out = self
            .command(i, program)
            .args(args)
            .output()
            .expect("run in namespace");
        assert!(
            out.status.success(),
            "{program} {} in {}: {}",
            args.join(" "),
            self.name(i),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The ids of the processes running in namespace `i`.
    pub fn pids(&self, i: usize) -> Vec<u32> {
        let out = Command::new("ip")
            .args(["netns", "pids", self.name(i)])
            .output()
            .expect("run ip netns pids");
        String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .filter_map(|pid| pid.parse().ok())
            .collect()
    }
}

impl Drop for Namespaces {
    fn drop(&mut self) {
        for i in 0..self.names.len() {
            for pid in self.pids(i) {
                let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
            }
        }
        for name in &self.names {
            let _ = Command::new("ip").args(["netns", "del", name]).status();
        }
    }
}
