//! The examples of `examples/` run to success: each checks its own outcome (every byte
//! arrived, the cancelled transfer was cancelled, the controller added streams) and exits
//! non-zero otherwise. `cargo test` builds them before it runs the tests.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

/// Longest an example may run.
const LIMIT: Duration = Duration::from_secs(120);

/// The built example `name`, next to this test's own binary (`target/PROFILE/deps/`).
fn example(name: &str) -> PathBuf {
    let deps = std::env::current_exe().unwrap();
    let path = deps
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .join("examples")
        .join(name);
    assert!(
        path.exists(),
        "{} is missing: run the whole `cargo test` (which builds the examples) or \
         `cargo build --examples` first",
        path.display()
    );
    path
}

/// Runs example `name`; its output is shown when it fails.
fn run(name: &str) {
    let output = tempfile::tempfile().unwrap();
    let started = Instant::now();
    let mut child = Command::new(example(name))
        .stdout(output.try_clone().unwrap())
        .stderr(output.try_clone().unwrap())
        .spawn()
        .unwrap();
    let shown = |mut file: &std::fs::File| {
        use std::io::{Read, Seek};
        let mut text = String::new();
        file.rewind().unwrap();
        file.read_to_string(&mut text).unwrap();
        text
    };
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            assert!(
                status.success(),
                "example {name} failed ({status}):\n{}",
                shown(&output)
            );
            return;
        }
        if started.elapsed() > LIMIT {
            let _ = child.kill();
            panic!(
                "example {name} ran longer than {LIMIT:?}:\n{}",
                shown(&output)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn send_receive_runs() {
    run("send_receive");
}

#[test]
fn transfer_queue_runs() {
    run("transfer_queue");
}

#[test]
fn custom_controller_runs() {
    run("custom_controller");
}

#[test]
fn send_directory_runs() {
    run("send_directory");
}
