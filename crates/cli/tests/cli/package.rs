//! The Debian package of `scripts/package-deb` as an administrator meets it: installed with
//! dpkg into a container-like root, its manual pages read with `man`, its completions loaded by
//! bash, its unit started by systemd and serving a sender, then removed and purged.
//!
//! The root is an overlay of this machine's own, in mount, PID, network and UTS namespaces of
//! its own, booted by its own systemd as PID 1: what dpkg and systemd do there lands in a
//! tmpfs that goes with the namespaces, never on the host.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::common::{is_root, write_data};

/// Mounts the overlay and boots systemd in it (run by `unshare` in the new namespaces; `$1` is
/// the tmpfs directory the overlay's writes go to). systemd mounts a tmpfs of its own on /tmp,
/// so files handed in go under /root.
const BOOT: &str = r#"set -e
w=$1
mount -t tmpfs xfer-test-root "$w"
mkdir "$w/upper" "$w/work" "$w/merged"
mount -t overlay overlay -o "lowerdir=/,upperdir=$w/upper,workdir=$w/work" "$w/merged"
m=$w/merged
mount -t proc proc "$m/proc"
mount --rbind /dev "$m/dev"
mount -t sysfs sysfs "$m/sys"
mount -t cgroup2 cgroup2 "$m/sys/fs/cgroup"
mount -t tmpfs tmpfs "$m/run"
exec env container=xfer-test chroot "$m" /lib/systemd/systemd --system --unit=multi-user.target
"#;

/// A booted container-like root; dropping it kills its systemd, and with it every process and
/// mount of its namespaces.
struct Container {
    unshare: Child,
    /// Its systemd (PID 1 inside), as the host numbers it.
    init: u32,
    _overlay: tempfile::TempDir,
}

impl Container {
    /// Boots one and waits until systemd has started every unit of multi-user.target.
    fn boot() -> Container {
        let overlay = tempfile::tempdir().unwrap();
        let unshare = Command::new("unshare")
            .args([
                "--mount",
                "--pid",
                "--net",
                "--uts",
                "--fork",
                "--kill-child=SIGKILL",
            ])
            .args(["bash", "-c", BOOT, "boot"])
            .arg(overlay.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .expect("run unshare");
        let children = format!("/proc/{0}/task/{0}/children", unshare.id());
        let started = Instant::now();
        let init = loop {
            let text = std::fs::read_to_string(&children).unwrap_or_default();
            if let Some(pid) = text.split_whitespace().next() {
                break pid.parse().unwrap();
            }
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "unshare started nothing"
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        // Until it execs systemd, the child is still bash mounting the overlay.
        let comm = format!("/proc/{init}/comm");
        while std::fs::read_to_string(&comm).unwrap_or_default().trim() != "systemd" {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "systemd never started"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let container = Container {
            unshare,
            init,
            _overlay: overlay,
        };
        // Until systemd has made /run/systemd/system, systemctl says "offline", and until its
        // bus is up, nothing; then --wait waits for the boot to end.
        let state = loop {
            let asked = container.sh("systemctl is-system-running --wait");
            let state = String::from_utf8_lossy(&asked.stdout).trim().to_string();
            if !state.is_empty() && state != "offline" {
                break state;
            }
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "the container's systemd never answered: {}",
                String::from_utf8_lossy(&asked.stderr)
            );
            std::thread::sleep(Duration::from_millis(50));
        };
        // "degraded" is a unit of this machine's own that cannot run in a container; the ones
        // under test are checked one by one below.
        assert!(
            state == "running" || state == "degraded",
            "the container's systemd is {state:?}: {}",
            container.ok("systemctl list-units --failed --no-pager || true")
        );
        container
    }

    /// Runs a shell script inside, as root.
    fn sh(&self, script: &str) -> Output {
        Command::new("nsenter")
            .args([
                "-t",
                &self.init.to_string(),
                "-m",
                "-p",
                "-n",
                "-u",
                "-r",
                "-w",
            ])
            .args(["sh", "-c", script])
            .env("MANPAGER", "cat")
            .stdin(Stdio::null())
            .output()
            .expect("run nsenter")
    }

    /// Runs a script that must succeed and returns its stdout.
    fn ok(&self, script: &str) -> String {
        let out = self.sh(script);
        assert!(
            out.status.success(),
            "`{script}` failed in the container ({}):\n{}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Where the host sees `path` of the container.
    fn host_path(&self, path: &str) -> PathBuf {
        Path::new(&format!("/proc/{}/root", self.init)).join(path.trim_start_matches('/'))
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        // unshare's --kill-child sends SIGKILL to systemd; PID 1 gone, the kernel kills the
        // rest of its PID namespace, and the mounts go with the last process.
        let _ = self.unshare.kill();
        let _ = self.unshare.wait();
    }
}

/// Builds the package from the binary under test; returns its path.
fn build_package(out: &Path) -> PathBuf {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let built = Command::new(workspace.join("scripts/package-deb"))
        .arg("--binary")
        .arg(env!("CARGO_BIN_EXE_xfer"))
        .arg("--out")
        .arg(out)
        .output()
        .expect("run scripts/package-deb");
    assert!(
        built.status.success(),
        "scripts/package-deb failed: {}",
        String::from_utf8_lossy(&built.stderr)
    );
    PathBuf::from(String::from_utf8(built.stdout).unwrap().trim())
}

#[test]
fn the_debian_package_installs_and_its_unit_starts_a_receiver_that_serves_a_sender() {
    if !is_root() {
        eprintln!("skipped: installing a package into a container-like root needs root");
        return;
    }
    let out = tempfile::tempdir().unwrap();
    let deb = build_package(out.path());
    let container = Container::boot();
    std::fs::copy(&deb, container.host_path("/root/xfer.deb")).unwrap();
    container.ok("dpkg -i /root/xfer.deb");

    // What postinst made: the user the unit runs as, its root, a key only it may read.
    let made = container.ok("stat -c '%U %a %n' /srv/xfer /etc/xfer/key");
    assert_eq!(made, "xfer 750 /srv/xfer\nxfer 600 /etc/xfer/key\n");
    assert!(
        container
            .ok("cat /etc/xfer/key")
            .chars()
            .filter(char::is_ascii_hexdigit)
            .count()
            == 32
    );

    // The manual pages and completions, generated from the flags the binary takes.
    let page = container.ok("man xfer-send");
    assert!(page.contains("xfer-send - Send files"), "{page}");
    assert!(page.contains("--rate-limit"), "{page}");
    assert!(container.ok("man xfer-recv").contains("--root"));
    let completion =
        container.ok("bash -c '. /usr/share/bash-completion/completions/xfer && complete -p xfer'");
    assert!(completion.contains("xfer"), "{completion}");
    assert!(container.ok("xfer --version").contains("revision"));

    // The unit, as shipped: enabled and started by systemd, it serves a sender with the key
    // postinst made, writing as the xfer user under /srv/xfer.
    container.ok("systemctl enable --now xfer-recv");
    let started = Instant::now();
    while !container.ok("ss -Hltn sport = :9000").contains("9000") {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the unit's receiver never listened: {}",
            container.ok("systemctl status xfer-recv --no-pager || true")
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    write_data(&container.host_path("/root/data.bin"), 3 << 20, 43);
    container.ok("XFER_KEY=$(cat /etc/xfer/key) xfer send /root/data.bin 127.0.0.1:9000:run1 -q");
    assert_eq!(
        container
            .ok("cmp /root/data.bin /srv/xfer/run1/data.bin && stat -c %U /srv/xfer/run1/data.bin"),
        "xfer\n"
    );
    container.ok("systemctl stop xfer-recv");
    assert_eq!(
        container.sh("systemctl is-active xfer-recv").stdout,
        b"inactive\n"
    );

    // Removal keeps the site's configuration; purging removes it and the key, never the data.
    container.ok("dpkg -r xfer");
    container.ok("test ! -e /usr/bin/xfer && test ! -e /lib/systemd/system/xfer-recv.service");
    container.ok("test -f /etc/xfer/recv.toml && test -f /etc/xfer/key");
    container.ok("dpkg -P xfer");
    container.ok("test ! -e /etc/xfer && test -f /srv/xfer/run1/data.bin");
}
