//! The QUIC layer on its own: a pinned certificate, a removed session, the binding both ends
//! export; and a sender over QUIC against a receiver that announces one certificate and
//! serves another: no QUIC connection is made and the transfer fails with a clear error.

use std::io::BufReader;
use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use super::*;
use crate::auth::{handshake_as_server, SessionKey};
use crate::link;
use crate::runtime::OwnedRuntime;
use crate::sender::{SendError, SendOptions, SendSource, Transfer};
use crate::tls::ServerIdentity;
use crate::transport::Transport;
use crate::wire::{write_message, FileStatus, FrameReader, Message, SessionLimits};

const KEY: &str = "quic-pinning-test-key-0123456789";

fn runtime() -> OwnedRuntime {
    OwnedRuntime::start("quic-test", 1).unwrap()
}

fn server(runtime: &OwnedRuntime) -> (QuicServer, SocketAddr) {
    let server = QuicServer::bind("127.0.0.1:0".parse().unwrap(), runtime.handle()).unwrap();
    let addr = server.endpoint.local_addr().unwrap();
    (server, addr)
}

/// Echoes what the first connection sends until it finishes, then waits for the client to close.
async fn echo_once(server: &QuicServer) -> io::Result<ChannelBinding> {
    let incoming = server.accept().await.expect("the endpoint is open");
    let mut stream = accept_stream(incoming).await?;
    let got = stream
        .recv
        .read_to_end(4 << 20)
        .await
        .map_err(io::Error::other)?;
    stream.send.write_all(&got).await?;
    stream.send.finish().map_err(io::Error::other)?;
    stream.connection.closed().await;
    Ok(stream.binding)
}

#[test]
fn a_pinned_certificate_carries_a_stream_both_ways() {
    let rt = runtime();
    let (server, addr) = server(&rt);
    let session = [3u8; 16];
    let hash = server.add_session(&session).unwrap();
    let client = QuicClient::new(&session, hash, Congestion::Bbr).unwrap();
    rt.handle().block_on(async {
        let serving = tokio::spawn(async move { echo_once(&server).await });
        let mut stream = client.connect(addr).await.unwrap();
        let sent: Vec<u8> = (0..1u32 << 20).map(|i| (i % 251) as u8).collect();
        stream.send.write_all(&sent).await.unwrap();
        stream.send.finish().unwrap();
        let back = stream.recv.read_to_end(2 << 20).await.unwrap();
        assert!(back == sent, "the echo differs");
        let info = stream.connection.sample().unwrap();
        assert!(info.bytes_acked >= 1 << 20, "{info:?}");
        assert!(info.data_segs_out > 0 && info.rtt_us > 0, "{info:?}");
        assert!(info.snd_mss >= 1200 && info.snd_cwnd > 0, "{info:?}");
        stream.connection.close();
        assert_eq!(stream.connection.sample(), None);
        let theirs = serving.await.unwrap().unwrap();
        assert_eq!(theirs, stream.binding, "both ends export the same binding");
        assert_ne!(stream.binding, ChannelBinding::PLAIN);
    });
}

#[test]
fn another_certificate_than_the_announced_one_is_refused() {
    let rt = runtime();
    let (server, addr) = server(&rt);
    let session = [4u8; 16];
    let mut other = server.add_session(&session).unwrap();
    other[0] ^= 1;
    let client = QuicClient::new(&session, other, Congestion::Cubic).unwrap();
    rt.handle().block_on(async {
        let _serving = tokio::spawn(async move { echo_once(&server).await });
        let err = client.connect(addr).await.err().expect("refused");
        assert!(matches!(err, QuicError::WrongCertificate), "{err}");
        assert!(err.to_string().contains("certificate"), "{err}");
    });
}

#[test]
fn a_session_without_a_certificate_cannot_connect() {
    let rt = runtime();
    let (server, addr) = server(&rt);
    let session = [5u8; 16];
    let hash = server.add_session(&session).unwrap();
    server.remove_session(&session);
    server.remove_session(&session); // gone already: nothing to do
    let client = QuicClient::new(&session, hash, Congestion::NewReno).unwrap();
    rt.handle().block_on(async {
        let _serving = tokio::spawn(async move { echo_once(&server).await });
        let err = client.connect(addr).await.err().expect("refused");
        assert!(matches!(err, QuicError::Io(_)), "{err}");
    });
}

#[test]
fn each_session_has_its_own_certificate() {
    let rt = runtime();
    let (server, _) = server(&rt);
    let (a, b) = (server.add_session(&[1; 16]), server.add_session(&[2; 16]));
    assert_ne!(a.unwrap(), b.unwrap());
}

#[test]
fn congestion_names_parse_back() {
    for c in [Congestion::Cubic, Congestion::Bbr, Congestion::NewReno] {
        assert_eq!(c.name().parse::<Congestion>(), Ok(c));
    }
    assert!("vegas".parse::<Congestion>().unwrap_err().contains("bbr"));
}

/// A receiver of one session that runs the real control protocol up to the QUIC offer, then
/// announces the hash of its session certificate, altered when `lie`. Returns its address and
/// the count of QUIC connections that completed their handshake with it.
fn receiver(lie: bool) -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let rt = runtime();
    let quic = Arc::new(QuicServer::bind(addr, rt.handle()).unwrap());
    let connected = Arc::new(AtomicUsize::new(0));
    let counter = connected.clone();
    let accepting = quic.clone();
    rt.handle().spawn(async move {
        while let Some(incoming) = accepting.accept().await {
            if let Ok(stream) = accept_stream(incoming).await {
                counter.fetch_add(1, Ordering::SeqCst);
                // This receiver serves no data stream: the sender's stream breaks.
                stream.connection.close();
            }
        }
    });
    std::thread::spawn(move || {
        let _rt = rt;
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
