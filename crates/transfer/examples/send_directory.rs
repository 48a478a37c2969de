//! Sends a directory and waits for the end on this thread: a program with no async runtime of
//! its own. `cargo run --release -p transfer --example send_directory -- DIR HOST:PORT KEYFILE`
//! sends DIR to a running `xfer recv`; without arguments the example sends a small tree it
//! makes to a receiver it starts on loopback, and checks that every byte arrived.

use std::error::Error;
use std::path::PathBuf;

use transfer::auth::{KeySetting, SessionKey};
use transfer::job::{SendJob, SenderSettings};
use transfer::receiver::{Receiver, ReceiverSettings};
use transfer::SendSource;

fn main() -> Result<(), Box<dyn Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match &args[..] {
        [dir, receiver, key] => send(dir.into(), receiver, KeySetting::File(key.into())),
        [] => demo(),
        _ => Err("usage: send_directory [DIR HOST:PORT KEYFILE]".into()),
    }
}

/// Sends `dir` to `receiver` with the default optimiser and waits for the end.
fn send(dir: PathBuf, receiver: &str, key: KeySetting) -> Result<(), Box<dyn Error>> {
    let settings = SenderSettings::new(
        receiver,
        key,
        SendSource::Paths {
            paths: vec![dir],
            destination: PathBuf::new(),
        },
    );
    let summary = SendJob::start(settings)?.wait()?;
    let (files, bytes, rate) = (summary.files, summary.bytes, summary.gbit_per_s());
    println!("sent {files} files, {bytes} bytes, at {rate:.2} Gbit/s");
    Ok(())
}

/// A small tree sent to a receiver started on loopback, then compared byte for byte.
fn demo() -> Result<(), Box<dyn Error>> {
    let work = tempfile::tempdir()?;
    let (dir, root) = (work.path().join("tree"), work.path().join("root"));
    std::fs::create_dir_all(dir.join("sub"))?;
    std::fs::create_dir(&root)?;
    let files = [("a.dat", 9 << 20), ("sub/b.dat", 300_000), ("sub/empty", 0)];
    for (name, len) in files {
        std::fs::write(
            dir.join(name),
            (0..len).map(|i: u32| i as u8).collect::<Vec<_>>(),
        )?;
    }
    let (key_text, key) = SessionKey::generate();
    let receiver = Receiver::bind(&ReceiverSettings::new(root.clone(), key).listen("127.0.0.1:0"))?;
    let addr = receiver.local_addr()?.to_string();
    std::thread::spawn(move || receiver.serve(None));
    send(dir.clone(), &addr, KeySetting::Text(key_text))?;
    for (name, _) in files {
        if std::fs::read(dir.join(name))? != std::fs::read(root.join("tree").join(name))? {
            return Err(format!("{name} differs from its source").into());
        }
    }
    println!("every file arrived byte-identical");
    Ok(())
}
