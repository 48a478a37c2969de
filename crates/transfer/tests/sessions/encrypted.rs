//! Encrypted sessions (TLS 1.3 on every connection): files arrive intact and none of their bytes
//! cross the wire in clear, plain sessions and streams are refused where encryption is
//! required, and a man in the middle who ends TLS on both sides cannot relay the key handshake.

use std::io::{BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::Path;
use std::sync::{Arc, Mutex};

use transfer::auth::{handshake_as_client, SessionKey};
use transfer::link;
use transfer::manifest::{ManifestBatch, SinkKind};
use transfer::receiver::{Receiver, ReceiverSettings};
use transfer::sender::{SendError, SendOptions, SendSource, Transfer};
use transfer::tls::ServerIdentity;
use transfer::wire::{write_message, FrameReader, Message, PresentFiles, Role};

use crate::common;

const KEY: &str = "encrypted-session-test-key-0123";

fn start_receiver(root: &Path, require_encryption: bool) -> String {
    let mut config = ReceiverSettings::new(root.to_path_buf(), SessionKey::from_text(KEY).unwrap());
    config.options.require_encryption = require_encryption;
    let receiver = Receiver::bind(&config.listen("127.0.0.1:0")).unwrap();
    let addr = receiver.local_addr().unwrap().to_string();
    std::thread::spawn(move || receiver.serve(None));
    addr
}

fn send(addr: &str, file: &Path, encrypt: bool) -> Result<(), String> {
    let options = SendOptions::default()
        .streams(3)
        .unit_size(256 << 10)
        .verify(true)
        .encrypt(encrypt);
    let source = SendSource::Paths {
        paths: vec![file.to_path_buf()],
        destination: Default::default(),
    };
    let key = SessionKey::from_text(KEY).unwrap();
    let explain = |e: SendError| common::explain(&e);
    let transfer = Transfer::start(addr, key, source, options).map_err(explain)?;
    transfer.wait().map(drop).map_err(explain)
}

/// A file whose every 64-byte block is distinct and recognisable.
fn write_marked_file(path: &Path, blocks: u32) -> Vec<u8> {
    let data: Vec<u8> = (0..blocks)
        .flat_map(|i| {
            format!("xfer-plaintext-marker-{i:020}-{:020}", u64::from(i) * 7919).into_bytes()
        })
        .collect();
    std::fs::write(path, &data).unwrap();
    data
}

/// Forwards every connection to `upstream` and records what the clients send.
fn recording_relay(upstream: String) -> (String, Arc<Mutex<Vec<u8>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = seen.clone();
    std::thread::spawn(move || {
        for client in listener.incoming() {
            let client = client.unwrap();
            let server = TcpStream::connect(&upstream).unwrap();
            let (mut c_read, mut s_write) =
                (client.try_clone().unwrap(), server.try_clone().unwrap());
            let record = record.clone();
            std::thread::spawn(move || {
                let mut buf = [0u8; 64 << 10];
                while let Ok(n @ 1..) = c_read.read(&mut buf) {
                    record.lock().unwrap().extend_from_slice(&buf[..n]);
                    if s_write.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
                let _ = s_write.shutdown(Shutdown::Write);
            });
            let (mut s_read, mut c_write) = (server, client);
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut s_read, &mut c_write);
                let _ = c_write.shutdown(Shutdown::Write);
            });
        }
    });
    (addr, seen)
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

#[test]
fn encrypted_files_arrive_intact_and_never_cross_the_wire_in_clear() {
    let src = tempfile::tempdir().unwrap();
    let file = src.path().join("marked");
    let data = write_marked_file(&file, 40_000); // 2.5 MiB: several units on several streams
    let marker = &data[1_000_000..1_000_064];

    let root = tempfile::tempdir().unwrap();
    let (relay, seen) = recording_relay(start_receiver(root.path(), true));
    send(&relay, &file, true).unwrap();
    assert_eq!(std::fs::read(root.path().join("marked")).unwrap(), data);
    let seen = std::mem::take(&mut *seen.lock().unwrap());
    assert!(
        seen.len() >= data.len(),
        "only {} bytes relayed",
        seen.len()
    );
    assert!(
        !contains(&seen, marker),
        "file bytes crossed the wire in clear"
    );

    // The same check finds the bytes of a plain session, so it can fail.
    let plain_root = tempfile::tempdir().unwrap();
    let (relay, seen) = recording_relay(start_receiver(plain_root.path(), false));
    send(&relay, &file, false).unwrap();
    assert!(contains(&seen.lock().unwrap(), marker));
}

#[test]
fn a_receiver_that_requires_encryption_refuses_plain_sessions_and_streams() {
    let src = tempfile::tempdir().unwrap();
    let file = src.path().join("f");
    write_marked_file(&file, 10);
    let root = tempfile::tempdir().unwrap();
    let addr = start_receiver(root.path(), true);
    let err = send(&addr, &file, false).unwrap_err();
    assert!(err.contains("only encrypted sessions"), "{err}");
    assert!(std::fs::read_dir(root.path()).unwrap().next().is_none());

    // An encrypted session's data stream must be encrypted too, even with the session's key.
    let key = SessionKey::from_text(KEY).unwrap();
    let open = |role: Role, key: &SessionKey, encrypt: bool| {
        let socket = TcpStream::connect(&addr).unwrap();
        let (reader, mut writer, channel) = link::client(&socket, encrypt).unwrap();
        let mut reader = FrameReader::new(BufReader::new(reader), 1 << 20);
        handshake_as_client(&mut reader, &mut writer, &channel, key, role, false)
            .map(|welcomed| (welcomed, reader, writer))
            .map_err(|e| e.to_string())
    };
    let (welcomed, mut control_reader, mut control_writer) =
        open(Role::Control, &key, true).unwrap();
    // The session exists once it said where its files go.
    let start = Message::Start {
        dest: Vec::new(),
        sink: SinkKind::Discard,
        present: PresentFiles::Kept,
        delete: None,
        striped: false,
    };
    write_message(&mut control_writer, &start).unwrap();
    let batch = Message::Entries(ManifestBatch::memory(10));
    write_message(&mut control_writer, &batch).unwrap();
    assert!(matches!(
        control_reader.read_message(),
        Ok(Message::Plan { .. })
    ));
    let data = Role::Data {
        session: welcomed.session,
    };
    let Err(err) = open(data.clone(), &welcomed.session_key, false) else {
        panic!("a plain stream joined an encrypted session");
    };
    assert!(err.contains("must its streams be"), "{err}");
    assert!(open(data, &welcomed.session_key, true).is_ok());
}

/// A relay that ends the sender's TLS with a certificate of its own, opens its own TLS to the
/// receiver, and passes the plaintext on: it sees everything but cannot pass the handshake.
#[test]
fn a_man_in_the_middle_ending_tls_cannot_relay_the_key_handshake() {
    let root = tempfile::tempdir().unwrap();
    let receiver = start_receiver(root.path(), true);
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let relay = listener.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        let identity = ServerIdentity::generate().unwrap();
        for client in listener.incoming() {
            let client = client.unwrap();
            let Ok(((mut from_client, mut to_client, _), _)) =
                link::server(&client, client.try_clone().unwrap(), &identity)
            else {
                continue;
            };
            let upstream = TcpStream::connect(&receiver).unwrap();
            let (mut from_server, mut to_server, _) = link::client(&upstream, true).unwrap();
            std::thread::spawn(move || std::io::copy(&mut from_client, &mut to_server));
            std::thread::spawn(move || std::io::copy(&mut from_server, &mut to_client));
        }
    });
    let src = tempfile::tempdir().unwrap();
    let file = src.path().join("f");
    write_marked_file(&file, 10);
    let err = send(&relay, &file, true).unwrap_err();
    assert!(err.contains("does not hold this key"), "{err}");
    assert!(std::fs::read_dir(root.path()).unwrap().next().is_none());
}

/// A client that sends the first byte of a TLS record and stalls is closed after the handshake
/// timeout, like any silent client.
#[test]
fn a_client_stalling_inside_the_tls_opening_is_closed_on_time() {
    let root = tempfile::tempdir().unwrap();
    let mut config = ReceiverSettings::new(
        root.path().to_path_buf(),
        SessionKey::from_text(KEY).unwrap(),
    );
    config.options.handshake_timeout = std::time::Duration::from_millis(800);
    let receiver = Receiver::bind(&config.listen("127.0.0.1:0")).unwrap();
    let addr = receiver.local_addr().unwrap();
    std::thread::spawn(move || receiver.serve(None));
    let mut socket = TcpStream::connect(addr).unwrap();
    socket.write_all(&[0x16]).unwrap();
    let started = std::time::Instant::now();
    socket
        .set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .unwrap();
    let mut buf = [0u8; 16];
    let closed = matches!(socket.read(&mut buf), Ok(0) | Err(_));
    assert!(closed && started.elapsed() < std::time::Duration::from_secs(3));
}
