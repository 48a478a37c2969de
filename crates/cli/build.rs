//! Records the revision `xfer` is built from, for `xfer --version`: the git commit of the
//! checkout, or `unknown` where there is none (a build from a packaged source).

use std::process::Command;

fn main() {
    let revision = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()
        .filter(|out| out.status.success())
        .and_then(|out| String::from_utf8(out.stdout).ok())
        .map(|rev| rev.trim().to_string())
        .filter(|rev| !rev.is_empty())
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=XFER_REVISION={revision}");
    // A new commit (HEAD moved, or the branch it names did) builds a new version line.
    for head in ["../../.git/HEAD", "../../.git/refs/heads"] {
        println!("cargo:rerun-if-changed={head}");
    }
}
