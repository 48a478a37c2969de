//! TLS 1.3 on a TCP connection (`--encrypt`), with rustls.
//!
//! The receiver makes a self-signed certificate when it starts; the sender accepts any
//! certificate (it checks the handshake's signature with it, but no chain): what
//! authenticates the two sides is the key handshake of [`crate::auth`], whose proofs cover
//! this connection's TLS exporter value ([`ChannelBinding`]). A man in the middle who ends TLS
//! on both sides has two different exporter values, so no proof it relays verifies.
//!
//! Both halves of a connection are used at once from two threads (a writer of chunks and a
//! reader of acknowledgements), so the rustls connection sits behind a mutex that is never held
//! across socket I/O: the writer encrypts under the lock and writes the records after it; the
//! reader reads ciphertext without the lock and decrypts under it. Records the reader's side
//! makes (a key update) wait in the connection until the writer's next write sends them, so
//! records always reach the socket in the order rustls made them.

use std::io::{self, IoSlice, Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{verify_tls13_signature, CryptoProvider};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName, UnixTime};
use rustls::{ClientConfig, ClientConnection, Connection, DigitallySignedStruct, ServerConfig};
use rustls::{ServerConnection, SignatureScheme};

use crate::auth::ChannelBinding;

/// First bytes of a TLS handshake record (content type 22, major version 3): how the receiver
/// tells a TLS client from a plain one on its single port. A plain connection starts with its
/// first frame's length, which is never this.
pub const TLS_RECORD_START: [u8; 2] = [0x16, 0x03];

/// Label of the TLS exporter value bound into the key handshake (RFC 8446 section 7.5).
pub(crate) const EXPORTER_LABEL: &[u8] = b"EXPORTER-xfer-channel-binding";

/// Ciphertext read from the socket at once.
const READ_CHUNK: usize = 64 << 10;

pub(crate) fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

pub(crate) fn tls_error(e: rustls::Error) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("TLS: {e}"))
}

/// The receiver's TLS identity: a fresh self-signed certificate and its key.
///
/// ```
/// let identity = transfer::tls::ServerIdentity::generate()?; // one per receiver start
/// # let _ = identity;
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Clone)]
pub struct ServerIdentity {
    config: Arc<ServerConfig>,
}

impl std::fmt::Debug for ServerIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ServerIdentity(..)")
    }
}

impl ServerIdentity {
    /// Generates a certificate for this receiver's lifetime.
    ///
    /// ```
    /// use transfer::tls::ServerIdentity;
    ///
    /// let (first, second) = (ServerIdentity::generate()?, ServerIdentity::generate()?);
    /// # let _ = (first, second);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn generate() -> io::Result<Self> {
        let (certificate, key) = self_signed("xfer-receiver")?;
        let config = ServerConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(tls_error)?
            .with_no_client_auth()
            .with_single_cert(vec![certificate], key)
            .map_err(tls_error)?;
        Ok(ServerIdentity {
            config: Arc::new(config),
        })
    }

    /// The server's side of a new TLS connection with this identity, before its handshake.
    pub(crate) fn server_connection(&self) -> io::Result<Connection> {
        let conn = ServerConnection::new(self.config.clone()).map_err(tls_error)?;
        Ok(conn.into())
    }
}

/// A fresh self-signed certificate for the DNS name `name`, and its private key.
pub(crate) fn self_signed(
    name: &str,
) -> io::Result<(CertificateDer<'static>, PrivateKeyDer<'static>)> {
    let certified = rcgen::generate_simple_self_signed(vec![name.to_string()])
        .map_err(|e| io::Error::other(format!("generating a TLS certificate: {e}")))?;
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(certified.key_pair.serialize_der()));
    Ok((certified.cert.der().clone(), key))
}

/// Checks the certificate a receiver shows. Over TCP (`--encrypt`) any certificate is accepted:
/// the key handshake's channel binding authenticates the receiver. Over QUIC the certificate
/// must also be the one the receiver announced on the authenticated control connection (its
/// BLAKE3 hash). Either way the receiver must hold the certificate's key (the handshake
/// signature is verified).
#[derive(Debug)]
pub(crate) struct ReceiverCertificate {
    provider: Arc<CryptoProvider>,
    pinned: Option<[u8; 32]>,
    /// Set when a certificate other than the pinned one was shown.
    mismatched: AtomicBool,
}

impl ReceiverCertificate {
    /// Accepts any certificate whose key signs the handshake.
    fn any() -> ReceiverCertificate {
        ReceiverCertificate {
            provider: provider(),
            pinned: None,
            mismatched: AtomicBool::new(false),
        }
    }

    /// Accepts only the certificate whose DER encoding hashes to `hash`.
    pub(crate) fn pinned(hash: [u8; 32]) -> ReceiverCertificate {
        ReceiverCertificate {
            pinned: Some(hash),
            ..ReceiverCertificate::any()
        }
    }

    /// Whether a receiver showed a certificate other than the pinned one.
    pub(crate) fn was_mismatched(&self) -> bool {
        self.mismatched.load(Ordering::Acquire)
    }
}

/// The hash by which a certificate is pinned.
pub(crate) fn certificate_hash(der: &[u8]) -> [u8; 32] {
    *blake3::hash(der).as_bytes()
}

impl ServerCertVerifier for ReceiverCertificate {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self.pinned {
            Some(pinned) if certificate_hash(end_entity) != pinned => {
                self.mismatched.store(true, Ordering::Release);
                Err(rustls::Error::InvalidCertificate(
                    rustls::CertificateError::ApplicationVerificationFailure,
                ))
            }
            _ => Ok(ServerCertVerified::assertion()),
        }
    }

    fn verify_tls12_signature(
        &self,
        _message: &[u8],
        _cert: &CertificateDer<'_>,
        _dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        // Only TLS 1.3 is offered.
        Err(rustls::Error::PeerIncompatible(
            rustls::PeerIncompatible::Tls12NotOffered,
        ))
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// A TLS 1.3 client configuration that checks the receiver's certificate with `check`.
pub(crate) fn client_config(check: Arc<ReceiverCertificate>) -> io::Result<ClientConfig> {
    Ok(ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(tls_error)?
        .dangerous()
        .with_custom_certificate_verifier(check)
        .with_no_client_auth())
}

/// True when the peer on `socket` opens with a TLS handshake. Waits for its first two bytes at
/// most the socket's read timeout (a peer that sends one byte and stalls times out too).
///
/// ```
/// use std::io::Write;
/// use std::net::{TcpListener, TcpStream};
///
/// let listener = TcpListener::bind("127.0.0.1:0")?;
/// let mut client = TcpStream::connect(listener.local_addr()?)?;
/// let (socket, _) = listener.accept()?;
/// client.write_all(&[0x16, 0x03])?; // how a TLS ClientHello record starts
/// assert!(transfer::tls::peer_starts_tls(&socket)?);
/// # Ok::<(), std::io::Error>(())
/// ```
pub fn peer_starts_tls(socket: &TcpStream) -> io::Result<bool> {
    let limit = socket
        .read_timeout()?
        .unwrap_or(std::time::Duration::from_secs(30));
    let deadline = std::time::Instant::now() + limit;
    let mut first = [0u8; 2];
    loop {
        let n = socket.peek(&mut first)?;
        if let Some(tls) = opens_tls(&first[..n])? {
            return Ok(tls);
        }
        if std::time::Instant::now() >= deadline {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the peer sent one byte and stopped",
            ));
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// Whether a connection whose first bytes are `first` (as peeked, at most two) opens with a
/// TLS handshake; `None` while one byte could still be the start of one. No bytes at all is
/// the end of the connection.
pub(crate) fn opens_tls(first: &[u8]) -> io::Result<Option<bool>> {
    match first {
        [] => Err(io::ErrorKind::UnexpectedEof.into()),
        [byte] if *byte == TLS_RECORD_START[0] => Ok(None),
        first => Ok(Some(first == TLS_RECORD_START)),
    }
}

/// Runs the TLS handshake as the sender over `socket` and splits the connection.
///
/// ```
/// use std::io::{Read, Write};
/// use std::net::{TcpListener, TcpStream};
/// use transfer::tls::{accept, connect, ServerIdentity};
///
/// let listener = TcpListener::bind("127.0.0.1:0")?;
/// let identity = ServerIdentity::generate()?;
/// let client = TcpStream::connect(listener.local_addr()?)?;
/// let receiver = std::thread::spawn(move || {
///     let (socket, _) = listener.accept().unwrap();
///     let (mut reader, _, binding) = accept(&identity, &socket, socket.try_clone().unwrap()).unwrap();
///     let mut text = String::new();
///     reader.read_to_string(&mut text).unwrap();
///     (text, binding)
/// });
/// let (_, mut writer, binding) = connect(&client, client.try_clone()?)?;
/// writer.write_all(b"encrypted")?;
/// writer.flush()?;
/// drop(writer);
/// client.shutdown(std::net::Shutdown::Write)?;
/// let (text, receivers) = receiver.join().unwrap();
/// assert_eq!((text.as_str(), receivers), ("encrypted", binding));
/// # Ok::<(), std::io::Error>(())
/// ```
pub fn connect<R: Read>(
    socket: &TcpStream,
    ciphertext: R,
) -> io::Result<(TlsReader<R>, TlsWriter, ChannelBinding)> {
    let name = ServerName::try_from("xfer-receiver").expect("a valid DNS name");
    let config = client_config(Arc::new(ReceiverCertificate::any()))?;
    let conn = ClientConnection::new(Arc::new(config), name).map_err(tls_error)?;
    finish_handshake(conn.into(), socket, ciphertext, true)
}

/// Runs the TLS handshake as the receiver: ciphertext comes from `ciphertext` (the
/// connection's reader, with its timeouts), replies go to `socket`.
///
/// ```
/// use std::net::{TcpListener, TcpStream};
/// use transfer::tls::{accept, ServerIdentity};
///
/// let listener = TcpListener::bind("127.0.0.1:0")?;
/// let identity = ServerIdentity::generate()?;
/// let mut plain = TcpStream::connect(listener.local_addr()?)?;
/// std::io::Write::write_all(&mut plain, b"not TLS at all")?;
/// drop(plain);
/// let (socket, _) = listener.accept()?;
/// assert!(accept(&identity, &socket, socket.try_clone()?).is_err());
/// # Ok::<(), std::io::Error>(())
/// ```
pub fn accept<R: Read>(
    identity: &ServerIdentity,
    socket: &TcpStream,
    ciphertext: R,
) -> io::Result<(TlsReader<R>, TlsWriter, ChannelBinding)> {
    finish_handshake(identity.server_connection()?, socket, ciphertext, false)
}

/// Runs the handshake of `conn` to its end. A `client` whose receiver answers in plain frames
/// instead (it refused the connection before TLS, [`crate::wire::Limit::Authenticating`])
/// fails with that refusal ([`crate::auth::AuthError::from_io`] gives it back).
fn finish_handshake<R: Read>(
    mut conn: Connection,
    socket: &TcpStream,
    source: R,
    client: bool,
) -> io::Result<(TlsReader<R>, TlsWriter, ChannelBinding)> {
    let mut ciphertext = Ciphertext {
        source,
        pending: Vec::new(),
        scratch: vec![0u8; READ_CHUNK].into_boxed_slice(),
    };
    let mut writer_socket = socket.try_clone()?;
    loop {
        while conn.wants_write() {
            conn.write_tls(&mut writer_socket)?;
        }
        if !conn.is_handshaking() {
            break;
        }
        if ciphertext.pending.is_empty() && ciphertext.read_more()? == 0 {
            return Err(closed_in_handshake());
        }
        // Every TLS record's second byte is its major version, 3; a plain frame's is a byte of
        // its length, which is never 3 for the short messages a refusal is.
        if client && ciphertext.pending.len() >= 2 && ciphertext.pending[1] != TLS_RECORD_START[1] {
            return Err(ciphertext.plain_answer());
        }
        ciphertext.decrypt(&mut conn)?;
    }
    let mut binding = [0u8; 32];
    conn.export_keying_material(&mut binding, EXPORTER_LABEL, None)
        .map_err(tls_error)?;
    let shared = Arc::new(Mutex::new(conn));
    let reader = TlsReader {
        ciphertext,
        shared: shared.clone(),
    };
    let writer = TlsWriter {
        socket: writer_socket,
        shared,
        records: Vec::new(),
    };
    Ok((reader, writer, ChannelBinding(binding)))
}

/// The error of a connection that the peer closed before its TLS handshake was done.
pub(crate) fn closed_in_handshake() -> io::Error {
    io::Error::new(
        io::ErrorKind::UnexpectedEof,
        "the peer closed the connection during the TLS handshake",
    )
}

/// Ciphertext on its way from the socket to rustls.
struct Ciphertext<R> {
    source: R,
    /// Read but not yet taken by rustls.
    pending: Vec<u8>,
    scratch: Box<[u8]>,
}

impl<R: Read> Ciphertext<R> {
    /// Reads more from the source (never under the connection's lock); 0 at its end.
    fn read_more(&mut self) -> io::Result<usize> {
        let n = self.source.read(&mut self.scratch)?;
        self.pending.extend_from_slice(&self.scratch[..n]);
        Ok(n)
    }

    /// The receiver's plain answer where its first TLS record was due, read whole (it is short)
    /// and given as the error it means.
    fn plain_answer(&mut self) -> io::Error {
        use crate::auth::{AuthError, HANDSHAKE_MESSAGE_LIMIT};
        use crate::wire::{FrameReader, Message, WireError};
        loop {
            let mut frames = FrameReader::new(&self.pending[..], 0);
            frames.set_message_limit(HANDSHAKE_MESSAGE_LIMIT);
            let error = match frames.read_message() {
                Ok(Message::Limited { limit }) => AuthError::Limited(limit),
                Ok(Message::Refused { reason }) => AuthError::Refused(reason),
                Err(WireError::Io(e)) if e.kind() == io::ErrorKind::UnexpectedEof => {
                    match self.read_more() {
                        Ok(0) => return e,
                        Ok(_) if self.pending.len() <= HANDSHAKE_MESSAGE_LIMIT => continue,
                        Ok(_) => AuthError::Protocol("the receiver did not answer in TLS".into()),
                        Err(e) => return e,
                    }
                }
                Ok(other) => AuthError::Protocol(format!(
                    "the receiver answered {} where TLS was due",
                    crate::auth::name(&other)
                )),
                Err(e) => AuthError::Protocol(format!("the receiver did not answer in TLS: {e}")),
            };
            return error.into_io();
        }
    }

    /// Hands pending ciphertext to `conn` until it takes no more or has plaintext to give.
    fn decrypt(&mut self, conn: &mut Connection) -> io::Result<()> {
        while !self.pending.is_empty() {
            let taken = conn.read_tls(&mut &self.pending[..])?;
            self.pending.drain(..taken);
            let state = conn.process_new_packets().map_err(tls_error)?;
            if taken == 0 || state.plaintext_bytes_to_read() > 0 {
                break;
            }
        }
        Ok(())
    }
}

/// The reading half of a TLS connection: plaintext out, ciphertext in from its source
/// ([`connect`] has an example).
///
/// ```
/// fn plaintext(reader: &mut transfer::tls::TlsReader<std::net::TcpStream>) -> std::io::Result<Vec<u8>> {
///     let mut out = Vec::new();
///     std::io::Read::read_to_end(reader, &mut out)?;
///     Ok(out)
/// }
/// # let _ = plaintext;
/// ```
pub struct TlsReader<R> {
    ciphertext: Ciphertext<R>,
    shared: Arc<Mutex<Connection>>,
}

impl<R> TlsReader<R> {
    /// Where the ciphertext comes from.
    ///
    /// ```
    /// fn patient(reader: &mut transfer::tls::TlsReader<std::net::TcpStream>) -> std::io::Result<()> {
    ///     reader.source_mut().set_read_timeout(Some(std::time::Duration::from_secs(60)))
    /// }
    /// # let _ = patient;
    /// ```
    pub fn source_mut(&mut self) -> &mut R {
        &mut self.ciphertext.source
    }
}

impl<R: Read> Read for TlsReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            {
                let mut conn = lock(&self.shared);
                self.ciphertext.decrypt(&mut conn)?;
                match conn.reader().read(buf) {
                    Ok(n) => return Ok(n),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) => return Err(e),
                }
                if !self.ciphertext.pending.is_empty() {
                    return Err(io::Error::other("TLS: rustls takes no more ciphertext"));
                }
            }
            if self.ciphertext.read_more()? == 0 {
                // The peer closed without close_notify: an end of stream like TCP's; the
                // protocol's own messages say whether it came at a clean point.
                return Ok(0);
            }
        }
    }
}

fn lock(shared: &Mutex<Connection>) -> MutexGuard<'_, Connection> {
    shared.lock().expect("TLS connection lock")
}

/// The writing half of a TLS connection ([`connect`] has an example).
///
/// ```
/// use transfer::seal::FrameWriter;
/// use transfer::tls::TlsWriter;
///
/// fn send(writer: &mut FrameWriter<TlsWriter>, message: &transfer::wire::Message) -> Result<(), transfer::wire::WireError> {
///     transfer::wire::write_message(writer, message)?;
///     std::io::Write::flush(writer)?;
///     Ok(())
/// }
/// # let _ = send;
/// ```
pub struct TlsWriter {
    socket: TcpStream,
    shared: Arc<Mutex<Connection>>,
    /// Records made under the lock, written after it.
    records: Vec<u8>,
}

impl TlsWriter {
    /// Encrypts `plaintext` (all of it) and sends every record the connection has made.
    fn send(&mut self, plaintext: &[IoSlice<'_>]) -> io::Result<usize> {
        self.records.clear();
        let mut written = 0;
        {
            let mut conn = lock(&self.shared);
            for slice in plaintext {
                let mut rest: &[u8] = slice;
                while !rest.is_empty() {
                    let n = conn.writer().write(rest)?;
                    rest = &rest[n..];
                    written += n;
                    while conn.wants_write() {
                        conn.write_tls(&mut self.records)?;
                    }
                }
            }
            while conn.wants_write() {
                conn.write_tls(&mut self.records)?;
            }
        }
        self.socket.write_all(&self.records)?;
        Ok(written)
    }
}

impl Write for TlsWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.send(&[IoSlice::new(buf)])
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        self.send(bufs)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.send(&[])?;
        Ok(())
    }
}
