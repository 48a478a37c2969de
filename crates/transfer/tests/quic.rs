//! A sender over QUIC accepts only the certificate its receiver announced on the authenticated
//! control connection: against a receiver that announces one certificate and serves another,
//! no QUIC connection is made and the transfer fails with a clear error.

use std::io::BufReader;
use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use transfer::auth::{handshake_as_server, SessionKey};
use transfer::link;
use transfer::quic::{Congestion, QuicServer};
use transfer::sender::{SendError, SendOptions, SendSource, Transfer};
use transfer::tls::ServerIdentity;
use transfer::transport::Transport;
use transfer::wire::{write_message, FileStatus, FrameReader, Message, SessionLimits};

const KEY: &str = "quic-pinning-test-key-0123456789";

/// A receiver of one session that runs the real control protocol up to the QUIC offer, then
/// announces the hash of its session certificate, altered when `lie`. Returns its address and
/// the count of QUIC connections that completed their handshake with it.
fn receiver(lie: bool) -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let quic = QuicServer::bind(addr).unwrap();
    let connected = Arc::new(AtomicUsize::new(0));
    let counter = connected.clone();
    std::thread::spawn(move || {
        let _accepting = quic
            .accept_while(
                Duration::from_secs(5),
                |_| Some(()),
                move |stream, _, ()| {
                    if let Ok(stream) = stream {
                        counter.fetch_add(1, Ordering::SeqCst);
                        // This receiver serves no data stream: the sender's stream breaks.
                        stream.connection.close();
                    }
                },
            )
            .unwrap();
        let (socket, _) = listener.accept().unwrap();
        let identity = ServerIdentity::generate().unwrap();
        let ((reader, mut writer, channel), encrypted) =
            link::server(&socket, socket.try_clone().unwrap(), &identity).unwrap();
        assert!(encrypted, "QUIC sessions encrypt their control connection");
        let mut reader = FrameReader::new(BufReader::new(reader), 1 << 20);
        let key = SessionKey::from_text(KEY).unwrap();
        handshake_as_server(&mut reader, &mut writer, &channel, |_| Ok(key)).unwrap();
        let session = [42u8; 16];
        let limits = SessionLimits {
            max_streams: 4,
            max_chunk: 1 << 20,
        };
        write_message(&mut writer, &Message::Welcome { session, limits }).unwrap();
        assert!(matches!(reader.read_message(), Ok(Message::Start { .. })));
        assert!(matches!(reader.read_message(), Ok(Message::QuicRequest)));
        let mut certificate = quic.add_session(&session).unwrap();
        if lie {
            certificate[7] ^= 0x10;
        }
        write_message(&mut writer, &Message::QuicOffer { certificate }).unwrap();
        let Message::Entries(batch) = reader.read_message().unwrap() else {
            panic!("expected the manifest")
        };
        let plan = Message::Plan {
            first: 0,
            files: vec![FileStatus::Missing; batch.files.len()],
            last: batch.last,
        };
        write_message(&mut writer, &plan).unwrap();
        // Serve until the sender gives up (it closes the control connection), or for a while
        // when it keeps trying to join.
        socket
            .set_read_timeout(Some(Duration::from_secs(3)))
            .unwrap();
        let _ = reader.read_message();
    });
    (addr, connected)
}

fn send(addr: SocketAddr) -> (Result<(), SendError>, Duration) {
    let src = tempfile::tempdir().unwrap();
    let file = src.path().join("f");
    std::fs::write(&file, vec![7u8; 100_000]).unwrap();
    let options = SendOptions::default()
        .streams(2)
        .unit_size(1 << 20)
        .stall_timeout(Duration::from_secs(10))
        .transport(Transport::Quic)
        .congestion(Congestion::Cubic);
    let source = SendSource::Paths {
        paths: vec![file],
        destination: PathBuf::new(),
    };
    let started = Instant::now();
    let key = SessionKey::from_text(KEY).unwrap();
    let result =
        Transfer::start(&addr.to_string(), key, source, options).and_then(|t| t.wait().map(drop));
    (result, started.elapsed())
}

#[test]
fn a_certificate_other_than_the_announced_one_is_refused() {
    let (addr, connected) = receiver(true);
    let (result, took) = send(addr);
    let err = result.unwrap_err();
    assert!(
        matches!(&err, SendError::Auth { cause, .. } if cause.to_string().contains("QUIC certificate is not the one its control connection announced")),
        "{err}"
    );
    assert!(took < Duration::from_secs(5), "took {took:?}");
    assert_eq!(connected.load(Ordering::SeqCst), 0);
}

/// The same receiver telling the truth: the sender's QUIC connections complete (the check
/// above can fail).
#[test]
fn the_announced_certificate_is_accepted() {
    let (addr, connected) = receiver(false);
    let (result, took) = send(addr);
    // This receiver serves no data stream, so the transfer cannot complete; it says so at
    // once, without waiting for streams still being opened to time out.
    assert!(result.is_err());
    assert!(took < Duration::from_secs(5), "took {took:?}");
    assert!(connected.load(Ordering::SeqCst) > 0);
}
