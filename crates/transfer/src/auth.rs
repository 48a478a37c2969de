//! Session keys and the mutual challenge-response handshake every connection starts with.
//!
//! The secret never crosses the wire: each side proves it knows the key with a BLAKE3 keyed hash
//! over both sides' fresh nonces, the connection's role, and a label saying who is proving. A
//! client without the key is refused before it can send a single data byte; a client also
//! checks the receiver's proof, so it never sends data to an impostor that merely accepted the
//! connection. A recorded handshake cannot be replayed: the receiver's nonce is new each time.
//!
//! Each side also sends a fresh X25519 public key (its share), which the proofs cover, and both
//! compute the Diffie-Hellman secret of the two: nobody who only watched the handshake knows it,
//! even with the receiver's key. The control connection's handshake derives the session's own
//! key from the receiver's key, both nonces, that secret and the session id, and every data
//! stream of the session proves that key, not the receiver's: a stream proves it belongs to
//! this session, and a peer that holds the receiver's key but did not open the session (or
//! watched it open) cannot join it.

use std::io::Read;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::seal::{FrameKey, FrameWrite};
use crate::wire::{
    FrameReader, Limit, Message, Role, SessionLimits, WireError, MAGIC, PROTOCOL_VERSION,
};

/// Fewest characters accepted in a session key.
pub const MIN_KEY_LEN: usize = 16;

/// Errors of key handling and of the handshake.
///
/// ```
/// use transfer::auth::{AuthError, SessionKey};
///
/// assert!(matches!(SessionKey::from_text("short"), Err(AuthError::InvalidKey(_))));
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AuthError {
    /// The key text is unusable.
    #[error("invalid key: {0}")]
    InvalidKey(String),
    /// The key file could not be read.
    #[error("cannot read key file {path}: {error}")]
    KeyFile {
        /// The file.
        path: String,
        /// The cause.
        error: std::io::Error,
    },
    /// The key file can be read by other users, so the key is not secret.
    #[error("key file {path} can be read by other users (mode {mode:o}): run chmod 600 {path}")]
    KeyFileExposed {
        /// The file.
        path: String,
        /// Its permission bits.
        mode: u32,
    },
    /// The peer's proof did not match: it does not hold the same key.
    #[error("authentication failed: {0}")]
    Rejected(String),
    /// The peer refused the connection with this reason.
    #[error("receiver refused the connection: {0}")]
    Refused(String),
    /// The receiver refused the session because this limit of its is reached.
    #[error("receiver refused the session: {0}")]
    Limited(Limit),
    /// The peer spoke something that is not this protocol.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// Framing or socket failure during the handshake.
    #[error(transparent)]
    Wire(#[from] WireError),
}

impl AuthError {
    /// As an I/O error, for a layer below the handshake (TLS) that meets a refusal;
    /// [`AuthError::from_io`] gives it back.
    pub(crate) fn into_io(self) -> std::io::Error {
        std::io::Error::other(self)
    }

    /// What an I/O error of a connection's setup means for its handshake: the refusal it
    /// carries (a TLS layer that met a plain refusal passes it up so), or a failure of the
    /// connection.
    ///
    /// ```
    /// use transfer::auth::AuthError;
    ///
    /// let reset = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
    /// assert!(matches!(AuthError::from_io(reset), AuthError::Wire(_)));
    /// ```
    pub fn from_io(e: std::io::Error) -> AuthError {
        e.downcast::<AuthError>()
            .unwrap_or_else(|e| AuthError::Wire(WireError::Io(e)))
    }
}

/// Names a key without revealing it: the first bytes of a keyed hash of a fixed label under
/// the key ([`SessionKey::id`]). A client says in its `Hello` which key it holds, so that a
/// receiver with several (one per tenant) proves that one.
///
/// ```
/// use transfer::auth::SessionKey;
///
/// let key = SessionKey::from_text("a-site-key-0123456789").unwrap();
/// assert_eq!(key.id(), SessionKey::from_text(" a-site-key-0123456789\n").unwrap().id());
/// assert_ne!(key.id(), SessionKey::from_text("another-key-0123456789").unwrap().id());
/// assert_eq!(format!("{:?}", key.id()).len(), "KeyId()".len() + 16);
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct KeyId(pub [u8; 8]);

impl std::fmt::Debug for KeyId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "KeyId(")?;
        self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))?;
        write!(f, ")")
    }
}

/// A session key: the MAC key derived from the secret text a receiver prints or reads from a file.
///
/// ```
/// use transfer::auth::SessionKey;
///
/// let (text, key) = SessionKey::generate();
/// println!("give the senders this key: {text}");
/// assert_eq!(format!("{key:?}"), "SessionKey(..)", "never printed");
/// ```
#[derive(Clone)]
pub struct SessionKey {
    mac_key: [u8; 32],
}

impl std::fmt::Debug for SessionKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SessionKey(..)")
    }
}

impl PartialEq for SessionKey {
    /// Compares in constant time (BLAKE3's `Hash` equality), as keys are secrets.
    fn eq(&self, other: &Self) -> bool {
        blake3::Hash::from(self.mac_key) == blake3::Hash::from(other.mac_key)
    }
}

impl Eq for SessionKey {}

impl SessionKey {
    /// Makes a fresh random key; returns its printable text (32 hex digits, 128 bits) and the key.
    ///
    /// ```
    /// use transfer::auth::SessionKey;
    ///
    /// let (text, _) = SessionKey::generate();
    /// assert_eq!(text.len(), 32);
    /// assert_ne!(text, SessionKey::generate().0);
    /// ```
    pub fn generate() -> (String, SessionKey) {
        let text: String = random_bytes::<16>()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let key = SessionKey::from_text(&text).expect("a generated key is valid");
        (text, key)
    }

    /// Derives the key from its text (surrounding white space ignored).
    ///
    /// ```
    /// use transfer::auth::SessionKey;
    ///
    /// assert!(SessionKey::from_text("  a-site-key-0123456789\n").is_ok());
    /// assert!(SessionKey::from_text("too-short").is_err());
    /// ```
    pub fn from_text(text: &str) -> Result<SessionKey, AuthError> {
        let text = text.trim();
        if text.len() < MIN_KEY_LEN {
            return Err(AuthError::InvalidKey(format!(
                "a key has at least {MIN_KEY_LEN} characters, this one has {}",
                text.len()
            )));
        }
        Ok(SessionKey {
            mac_key: blake3::derive_key("xfer v1 session key", text.as_bytes()),
        })
    }

    /// Reads the key text from a file, which only its owner may read (as ssh insists for its
    /// private keys): a file that group or others can read is refused.
    ///
    /// ```
    /// use std::os::unix::fs::PermissionsExt;
    /// use transfer::auth::{AuthError, SessionKey};
    ///
    /// let dir = tempfile::tempdir().unwrap();
    /// let file = dir.path().join("key");
    /// std::fs::write(&file, "a-site-key-0123456789\n").unwrap();
    /// std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    /// assert!(matches!(SessionKey::from_file(&file), Err(AuthError::KeyFileExposed { mode: 0o644, .. })));
    /// std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    /// assert!(SessionKey::from_file(&file).is_ok());
    /// ```
    pub fn from_file(path: &Path) -> Result<SessionKey, AuthError> {
        use std::io::Read;
        use std::os::unix::fs::PermissionsExt;
        let shown = || path.display().to_string();
        let read_error = |error| AuthError::KeyFile {
            path: shown(),
            error,
        };
        let mut file = std::fs::File::open(path).map_err(read_error)?;
        let mode = file.metadata().map_err(read_error)?.permissions().mode();
        if mode & 0o077 != 0 {
            return Err(AuthError::KeyFileExposed {
                path: shown(),
                mode: mode & 0o7777,
            });
        }
        let mut text = String::new();
        file.read_to_string(&mut text).map_err(read_error)?;
        SessionKey::from_text(&text)
    }

    /// The key of one session: what its data streams prove. Derived from this (the receiver's)
    /// key, the nonces of the control connection's handshake and the session id.
    ///
    /// ```
    /// # use std::os::unix::net::UnixStream;
    /// # use transfer::auth::{handshake_as_client, handshake_as_server, ChannelBinding, SessionKey};
    /// # use transfer::wire::{FrameReader, Role};
    /// # let key = SessionKey::from_text("the-receivers-key-0123456789").unwrap();
    /// # let (client_end, server_end) = UnixStream::pair().unwrap();
    /// # let server_key = key.clone();
    /// # let server = std::thread::spawn(move || {
    /// #     let mut reader = FrameReader::new(server_end.try_clone().unwrap(), 0);
    /// #     let mut writer = server_end;
    /// #     let proven = handshake_as_server(&mut reader, &mut writer, &ChannelBinding::PLAIN, |_| Ok(server_key.clone()));
    /// #     if proven.is_ok() {
    /// #         let welcome = transfer::wire::Message::Welcome { session: [9; 16], limits: transfer::wire::SessionLimits { max_streams: 8, max_chunk: 1 << 20 } };
    /// #         transfer::wire::write_message(&mut writer, &welcome).unwrap();
    /// #     }
    /// #     proven
    /// # });
    /// # let mut reader = FrameReader::new(client_end.try_clone().unwrap(), 0);
    /// # let mut writer = client_end;
    /// use transfer::auth::Agreed;
    ///
    /// let welcomed = handshake_as_client(&mut reader, &mut writer, &ChannelBinding::PLAIN, &key, Role::Control, false).unwrap();
    /// let (_, agreed): (_, Agreed) = server.join().unwrap().unwrap();
    /// // The receiver derives the same key for the session's data streams to prove.
    /// assert_eq!(key.for_session(&agreed, &welcomed.session).id(), welcomed.session_key.id());
    /// ```
    pub fn for_session(&self, agreed: &Agreed, session: &[u8; 16]) -> SessionKey {
        let mut material = Vec::with_capacity(32 + 96 + 16);
        material.extend_from_slice(&self.mac_key);
        material.extend_from_slice(&agreed.client_nonce);
        material.extend_from_slice(&agreed.server_nonce);
        material.extend_from_slice(&agreed.secret);
        material.extend_from_slice(session);
        SessionKey {
            mac_key: blake3::derive_key("xfer v3 session of a receiver key", &material),
        }
    }

    /// The key's public name ([`KeyId`]), which a client sends in its `Hello`.
    ///
    /// ```
    /// use transfer::auth::SessionKey;
    ///
    /// let (_, a) = SessionKey::generate();
    /// let (_, b) = SessionKey::generate();
    /// assert_ne!(a.id(), b.id());
    /// ```
    pub fn id(&self) -> KeyId {
        let hash = blake3::keyed_hash(&self.mac_key, b"xfer v1 key id");
        let mut id = [0u8; 8];
        id.copy_from_slice(&hash.as_bytes()[..8]);
        KeyId(id)
    }

    /// The proof `who` gives of this key over everything the handshake said in the clear.
    fn proof(
        &self,
        who: &[u8],
        channel: &ChannelBinding,
        said: &Said,
        role: &Role,
    ) -> blake3::Hash {
        let mut mac = blake3::Hasher::new_keyed(&self.mac_key);
        mac.update(who);
        mac.update(&channel.0);
        mac.update(&said.client_nonce);
        mac.update(&said.server_nonce);
        mac.update(&said.client_share);
        mac.update(&said.server_share);
        mac.update(&[u8::from(said.sealed)]);
        match role {
            Role::Control => mac.update(b"control"),
            Role::Data { session } => mac.update(b"data").update(session),
        };
        mac.finalize()
    }
}

/// What the connection under the handshake is, bound into every proof: the TLS exporter value
/// of an encrypted connection, so that a proof made on one TLS connection verifies on no other
/// (a man in the middle ending TLS on both sides cannot relay it); [`ChannelBinding::PLAIN`]
/// on plain TCP.
///
/// ```
/// use transfer::auth::ChannelBinding;
///
/// assert_eq!(ChannelBinding::PLAIN, ChannelBinding([0; 32]));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChannelBinding(pub [u8; 32]);

impl ChannelBinding {
    /// A plain TCP connection.
    pub const PLAIN: ChannelBinding = ChannelBinding([0; 32]);
}

/// What one handshake agreed on: both sides' fresh nonces, and the X25519 secret only its two
/// ends know (which keys derived from it, [`SessionKey::for_session`], are kept from anyone who
/// watched it).
///
/// ```
/// # use std::os::unix::net::UnixStream;
/// # use transfer::auth::{handshake_as_client, handshake_as_server, ChannelBinding, SessionKey};
/// # use transfer::wire::{FrameReader, Role};
/// # let key = SessionKey::from_text("the-receivers-key-0123456789").unwrap();
/// # let (client_end, server_end) = UnixStream::pair().unwrap();
/// # let server_key = key.clone();
/// # let server = std::thread::spawn(move || {
/// #     let mut reader = FrameReader::new(server_end.try_clone().unwrap(), 0);
/// #     let mut writer = server_end;
/// #     let proven = handshake_as_server(&mut reader, &mut writer, &ChannelBinding::PLAIN, |_| Ok(server_key.clone()));
/// #     if proven.is_ok() {
/// #         let welcome = transfer::wire::Message::Welcome { session: [9; 16], limits: transfer::wire::SessionLimits { max_streams: 8, max_chunk: 1 << 20 } };
/// #         transfer::wire::write_message(&mut writer, &welcome).unwrap();
/// #     }
/// #     proven
/// # });
/// # let mut reader = FrameReader::new(client_end.try_clone().unwrap(), 0);
/// # let mut writer = client_end;
/// handshake_as_client(&mut reader, &mut writer, &ChannelBinding::PLAIN, &key, Role::Control, false).unwrap();
/// let (_, agreed) = server.join().unwrap().unwrap();
/// assert_ne!(agreed.client_nonce, agreed.server_nonce);
/// assert!(format!("{agreed:?}").ends_with("secret: .. }"), "never printed");
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct Agreed {
    /// The client's nonce, from `Hello`.
    pub client_nonce: [u8; 32],
    /// The receiver's nonce, from `Challenge`.
    pub server_nonce: [u8; 32],
    secret: [u8; 32],
}

impl std::fmt::Debug for Agreed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Agreed {{ client_nonce: {:02x?}, server_nonce: {:02x?}, secret: .. }}",
            &self.client_nonce[..4],
            &self.server_nonce[..4]
        )
    }
}

/// What a handshake says in the clear, which both proofs cover.
struct Said {
    client_nonce: [u8; 32],
    server_nonce: [u8; 32],
    client_share: [u8; 32],
    server_share: [u8; 32],
    /// The client asked for sealed frames ([`crate::seal`]): covered, so that nobody on the
    /// path can turn it off.
    sealed: bool,
}

impl Agreed {
    /// The keys of the frames a connection whose handshake agreed this, proving `proven`,
    /// carries once it is sealed ([`crate::seal`]): what the client sends, and what the
    /// receiver sends.
    pub(crate) fn frame_keys(&self, proven: &SessionKey) -> (FrameKey, FrameKey) {
        let mut material = Vec::with_capacity(32 * 4);
        material.extend_from_slice(&proven.mac_key);
        material.extend_from_slice(&self.client_nonce);
        material.extend_from_slice(&self.server_nonce);
        material.extend_from_slice(&self.secret);
        let key = |context: &str| FrameKey::new(blake3::derive_key(context, &material));
        (
            key("xfer v1 frames from the client"),
            key("xfer v1 frames from the receiver"),
        )
    }
}

/// What a client's `Hello` asks, as [`handshake_as_server`] hands it to the receiver to choose
/// the key to prove, or to refuse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Asked {
    /// What the connection is for.
    pub role: Role,
    /// The key the client holds.
    pub key: KeyId,
    /// Whether the client seals its frames after the handshake ([`crate::seal`]).
    pub sealed: bool,
}

/// One side's ephemeral X25519 key for one handshake (rustls's key exchange, which TLS uses).
struct Exchange(Box<dyn rustls::crypto::ActiveKeyExchange>);

impl Exchange {
    fn start() -> Result<Exchange, AuthError> {
        rustls::crypto::ring::kx_group::X25519
            .start()
            .map(Exchange)
            .map_err(|e| AuthError::Protocol(format!("cannot make a key share: {e}")))
    }

    /// The public key this side sends.
    fn share(&self) -> [u8; 32] {
        let mut share = [0u8; 32];
        share.copy_from_slice(self.0.pub_key());
        share
    }

    /// The secret of this side's key and the peer's `share`; a share that makes no secret
    /// (of low order) is refused.
    fn finish(self, peer: &[u8; 32]) -> Result<[u8; 32], AuthError> {
        let shared = self
            .0
            .complete(peer)
            .map_err(|e| AuthError::Protocol(format!("the peer's key share is unusable: {e}")))?;
        let mut secret = [0u8; 32];
        secret.copy_from_slice(shared.secret_bytes());
        Ok(secret)
    }
}

/// What a client learns from `Welcome`.
///
/// ```
/// # use std::os::unix::net::UnixStream;
/// # use transfer::auth::{handshake_as_client, handshake_as_server, ChannelBinding, SessionKey};
/// # use transfer::wire::{FrameReader, Role};
/// # let key = SessionKey::from_text("the-receivers-key-0123456789").unwrap();
/// # let (client_end, server_end) = UnixStream::pair().unwrap();
/// # let server_key = key.clone();
/// # let server = std::thread::spawn(move || {
/// #     let mut reader = FrameReader::new(server_end.try_clone().unwrap(), 0);
/// #     let mut writer = server_end;
/// #     let proven = handshake_as_server(&mut reader, &mut writer, &ChannelBinding::PLAIN, |_| Ok(server_key.clone()));
/// #     if proven.is_ok() {
/// #         let welcome = transfer::wire::Message::Welcome { session: [9; 16], limits: transfer::wire::SessionLimits { max_streams: 8, max_chunk: 1 << 20 } };
/// #         transfer::wire::write_message(&mut writer, &welcome).unwrap();
/// #     }
/// #     proven
/// # });
/// # let mut reader = FrameReader::new(client_end.try_clone().unwrap(), 0);
/// # let mut writer = client_end;
/// let welcomed = handshake_as_client(&mut reader, &mut writer, &ChannelBinding::PLAIN, &key, Role::Control, false).unwrap();
/// assert_eq!((welcomed.session, welcomed.limits.max_streams), ([9; 16], 8));
/// # server.join().unwrap().unwrap();
/// ```
#[derive(Debug, Clone)]
pub struct Welcomed {
    /// The session id.
    pub session: [u8; 16],
    /// The receiver's limits for the session.
    pub limits: SessionLimits,
    /// The key the session's data streams prove: derived for a control connection, the key the
    /// connection proved for a data stream.
    pub session_key: SessionKey,
}

/// What a client tells the receiver when the receiver's proof does not match its key.
const KEY_MISMATCH: &str = "wrong key: the client's key differs from the receiver's";

/// Largest message accepted before the peer has proven the key: a handshake message is under
/// 200 bytes, so a stranger cannot make the receiver buffer more than this.
pub const HANDSHAKE_MESSAGE_LIMIT: usize = 4096;

/// Fills an array from the operating system's random source.
///
/// ```
/// let nonce: [u8; 32] = transfer::auth::random_bytes();
/// assert_ne!(nonce, [0; 32]);
/// ```
pub fn random_bytes<const N: usize>() -> [u8; N] {
    let mut out = [0u8; N];
    getrandom::fill(&mut out).expect("the operating system's random source failed");
    out
}

/// The client side of the handshake over a reader and a writer of the same connection, whose
/// `channel` binding the proofs cover. With `sealed`, both halves seal every frame after the
/// client's proof ([`crate::seal`]; the writer must be able to, such as a
/// [`crate::seal::FrameWriter`]), `Welcome` first.
///
/// A client and a receiver on the two ends of a socket pair:
///
/// ```
/// # use std::os::unix::net::UnixStream;
/// # use transfer::auth::{handshake_as_client, handshake_as_server, ChannelBinding, SessionKey};
/// # use transfer::wire::{FrameReader, Role};
/// # let key = SessionKey::from_text("the-receivers-key-0123456789").unwrap();
/// # let (client_end, server_end) = UnixStream::pair().unwrap();
/// # let server_key = key.clone();
/// # let server = std::thread::spawn(move || {
/// #     let mut reader = FrameReader::new(server_end.try_clone().unwrap(), 0);
/// #     let mut writer = server_end;
/// #     let proven = handshake_as_server(&mut reader, &mut writer, &ChannelBinding::PLAIN, |_| Ok(server_key.clone()));
/// #     if proven.is_ok() {
/// #         let welcome = transfer::wire::Message::Welcome { session: [9; 16], limits: transfer::wire::SessionLimits { max_streams: 8, max_chunk: 1 << 20 } };
/// #         transfer::wire::write_message(&mut writer, &welcome).unwrap();
/// #     }
/// #     proven
/// # });
/// # let mut reader = FrameReader::new(client_end.try_clone().unwrap(), 0);
/// # let mut writer = client_end;
/// let welcomed = handshake_as_client(&mut reader, &mut writer, &ChannelBinding::PLAIN, &key, Role::Control, false).unwrap();
/// assert_eq!(welcomed.session, [9; 16]);
/// assert_eq!(server.join().unwrap().unwrap().0.role, Role::Control);
/// ```
pub fn handshake_as_client<R: Read, W: FrameWrite>(
    reader: &mut FrameReader<R>,
    writer: &mut W,
    channel: &ChannelBinding,
    key: &SessionKey,
    role: Role,
    sealed: bool,
) -> Result<Welcomed, AuthError> {
    let refused = |writer: &mut W, refusal: Refusal| {
        if let Some(reason) = refusal.told {
            // Tell the receiver why, so its log says more than that the connection closed.
            let _ = crate::wire::write_message(writer, &Message::Refused { reason });
        }
        refusal.error
    };
    let (greeting, hello) = Greeting::start(key, role, sealed)?;
    crate::wire::write_message(writer, &hello)?;
    let (mut proving, auth) = greeting
        .challenge(reader.read_message(), channel)
        .map_err(|r| refused(writer, r))?;
    crate::wire::write_message(writer, &auth)?;
    if let Some((outgoing, incoming)) = proving.frame_keys.take() {
        writer.seal_with(outgoing).map_err(WireError::Io)?;
        reader.open_sealed(incoming);
    }
    proving.welcome(reader.read_message())
}

/// The client's side of the key handshake as rules, with no connection: its `Hello` out
/// ([`Greeting::start`]), the receiver's `Challenge` in and the client's `Auth` out
/// ([`Greeting::challenge`]), then `Welcome` in ([`Proving::welcome`]). A driver reads and
/// writes the messages ([`handshake_as_client`] blocking, a QUIC stream's task
/// asynchronously); a refusal says what to tell the receiver. A `Greeting` is the handshake
/// whose `Hello` went out, waiting for the challenge.
pub(crate) struct Greeting {
    key: SessionKey,
    role: Role,
    sealed: bool,
    client_nonce: [u8; 32],
    exchange: Exchange,
}

/// A client's handshake whose proof went out, waiting for `Welcome`; with sealed frames, the
/// keys of the frames from now on (what the client sends, what it reads).
pub(crate) struct Proving {
    key: SessionKey,
    role: Role,
    agreed: Agreed,
    /// The keys of the frames written and read once sealed.
    pub(crate) frame_keys: Option<(FrameKey, FrameKey)>,
}

impl Greeting {
    /// A handshake proving `key` for `role`, sealing its frames afterwards when `sealed`, and
    /// the `Hello` that opens it.
    pub(crate) fn start(
        key: &SessionKey,
        role: Role,
        sealed: bool,
    ) -> Result<(Greeting, Message), AuthError> {
        let greeting = Greeting {
            key: key.clone(),
            role,
            sealed,
            client_nonce: random_bytes::<32>(),
            exchange: Exchange::start()?,
        };
        let hello = Message::Hello {
            magic: MAGIC,
            version: PROTOCOL_VERSION,
            role: greeting.role.clone(),
            nonce: greeting.client_nonce,
            key: greeting.key.id(),
            share: greeting.exchange.share(),
            sealed,
        };
        Ok((greeting, hello))
    }

    /// Takes the receiver's answer to `Hello` (`read`, as read from the connection, whose
    /// `channel` binding the proofs cover): its `Challenge`, whose proof must match the key,
    /// answered by the client's `Auth` to send.
    pub(crate) fn challenge(
        self,
        read: Result<Message, WireError>,
        channel: &ChannelBinding,
    ) -> Result<(Proving, Message), Refusal> {
        let (server_nonce, server_share, server_proof) = match read? {
            Message::Challenge {
                nonce,
                share,
                proof,
            } => (nonce, share, proof),
            Message::Refused { reason } => return Err(AuthError::Refused(reason).into()),
            Message::Limited { limit } => return Err(AuthError::Limited(limit).into()),
            other => {
                let got = name(&other);
                return Err(AuthError::Protocol(format!("expected Challenge, got {got}")).into());
            }
        };
        let Greeting {
            key,
            role,
            sealed,
            client_nonce,
            exchange,
        } = self;
        let said = Said {
            client_nonce,
            server_nonce,
            client_share: exchange.share(),
            server_share,
            sealed,
        };
        if key.proof(b"server", channel, &said, &role) != blake3::Hash::from(server_proof) {
            return Err(Refusal {
                told: Some(KEY_MISMATCH.into()),
                error: AuthError::Rejected(match role {
                    Role::Control => "the receiver does not hold this key (check the key)".into(),
                    Role::Data { .. } => "the receiver does not know this session's key".into(),
                }),
            });
        }
        let agreed = Agreed {
            client_nonce,
            server_nonce,
            secret: exchange.finish(&server_share)?,
        };
        let auth = Message::Auth {
            proof: *key.proof(b"client", channel, &said, &role).as_bytes(),
        };
        let frame_keys = sealed.then(|| agreed.frame_keys(&key));
        let proving = Proving {
            key,
            role,
            agreed,
            frame_keys,
        };
        Ok((proving, auth))
    }
}

impl Proving {
    /// Takes the receiver's answer to the proof (`read`, as read from the connection): its
    /// `Welcome`, with the session and the key its data streams prove.
    pub(crate) fn welcome(self, read: Result<Message, WireError>) -> Result<Welcomed, AuthError> {
        match read? {
            Message::Welcome { session, limits } => {
                let session_key = match self.role {
                    Role::Control => self.key.for_session(&self.agreed, &session),
                    Role::Data { .. } => self.key,
                };
                Ok(Welcomed {
                    session,
                    limits,
                    session_key,
                })
            }
            Message::Refused { reason } => Err(AuthError::Refused(reason)),
            Message::Limited { limit } => Err(AuthError::Limited(limit)),
            other => Err(AuthError::Protocol(format!(
                "expected Welcome, got {}",
                name(&other)
            ))),
        }
    }
}

/// The receiver side of the handshake, up to (not including) `Welcome`: returns what was asked
/// and proven and what the handshake agreed. `key_for` gives the key what the client asks must
/// prove (for a control connection the receiver's key the client names by its [`KeyId`], for a
/// data stream its session's key) or the reason to refuse it. When the client asked for sealed
/// frames, `reader` and `writer` seal them from here on ([`crate::seal`]).
///
/// Messages are read with [`HANDSHAKE_MESSAGE_LIMIT`] in force. On a wrong proof it sends
/// `Refused` and fails, so the caller drops the connection before reading anything else.
///
/// A client with another key is refused, and learns nothing it could replay:
///
/// ```
/// # use std::os::unix::net::UnixStream;
/// # use transfer::auth::{handshake_as_client, handshake_as_server, ChannelBinding, SessionKey};
/// # use transfer::wire::{FrameReader, Role};
/// # let key = SessionKey::from_text("the-receivers-key-0123456789").unwrap();
/// # let (client_end, server_end) = UnixStream::pair().unwrap();
/// # let server_key = key.clone();
/// # let server = std::thread::spawn(move || {
/// #     let mut reader = FrameReader::new(server_end.try_clone().unwrap(), 0);
/// #     let mut writer = server_end;
/// #     let proven = handshake_as_server(&mut reader, &mut writer, &ChannelBinding::PLAIN, |_| Ok(server_key.clone()));
/// #     if proven.is_ok() {
/// #         let welcome = transfer::wire::Message::Welcome { session: [9; 16], limits: transfer::wire::SessionLimits { max_streams: 8, max_chunk: 1 << 20 } };
/// #         transfer::wire::write_message(&mut writer, &welcome).unwrap();
/// #     }
/// #     proven
/// # });
/// # let mut reader = FrameReader::new(client_end.try_clone().unwrap(), 0);
/// # let mut writer = client_end;
/// let wrong = SessionKey::from_text("somebody-elses-key-0123456789").unwrap();
/// assert!(handshake_as_client(&mut reader, &mut writer, &ChannelBinding::PLAIN, &wrong, Role::Control, false).is_err());
/// assert!(server.join().unwrap().is_err());
/// ```
pub fn handshake_as_server<R: Read, W: FrameWrite>(
    reader: &mut FrameReader<R>,
    writer: &mut W,
    channel: &ChannelBinding,
    key_for: impl FnOnce(&Asked) -> Result<SessionKey, String>,
) -> Result<(Asked, Agreed), AuthError> {
    let refused = |writer: &mut W, refusal: Refusal| {
        if let Some(reason) = refusal.told {
            let _ = crate::wire::write_message(writer, &Message::Refused { reason });
        }
        refusal.error
    };
    reader.set_message_limit(HANDSHAKE_MESSAGE_LIMIT);
    let (challenged, challenge) = Challenged::from_hello(reader.read_message(), channel, key_for)
        .map_err(|r| refused(writer, r))?;
    crate::wire::write_message(writer, &challenge)?;
    let proven = challenged
        .auth(reader.read_message())
        .map_err(|r| refused(writer, r))?;
    if let Some((incoming, outgoing)) = proven.frame_keys {
        writer.seal_with(outgoing).map_err(WireError::Io)?;
        reader.open_sealed(incoming);
    }
    Ok((proven.asked, proven.agreed))
}

/// A handshake refused: why, and the reason to tell the client first in `Refused`, if any
/// (none for a peer that is not an xfer client, or that refused first).
#[derive(Debug)]
pub(crate) struct Refusal {
    /// Why.
    pub(crate) error: AuthError,
    /// The reason the client is told.
    pub(crate) told: Option<String>,
}

impl Refusal {
    /// A refusal the client is told of, with `reason`.
    fn told(reason: String, error: impl FnOnce(String) -> AuthError) -> Refusal {
        Refusal {
            told: Some(reason.clone()),
            error: error(reason),
        }
    }
}

impl<E: Into<AuthError>> From<E> for Refusal {
    fn from(error: E) -> Refusal {
        Refusal {
            error: error.into(),
            told: None,
        }
    }
}

/// The receiver's side of the key handshake as rules, with no connection: the client's
/// `Hello` in and the `Challenge` out ([`Challenged::from_hello`]), then its `Auth` in and
/// what both agreed out ([`Challenged::auth`]). A driver reads and writes the messages
/// ([`handshake_as_server`] blocking); each refusal says what to tell the client. In between,
/// a `Challenged` is the handshake whose `Challenge` went out, waiting for the proof.
pub(crate) struct Challenged {
    asked: Asked,
    key: SessionKey,
    channel: ChannelBinding,
    said: Said,
    secret: [u8; 32],
}

/// What a handshake proved: what the client asked, what both agreed, and on a sealed
/// connection the keys of the frames from then on (the client's, the receiver's).
pub(crate) struct Proven {
    /// What the client asked.
    pub(crate) asked: Asked,
    /// What both agreed.
    pub(crate) agreed: Agreed,
    /// The keys of the frames read and written once sealed.
    pub(crate) frame_keys: Option<(FrameKey, FrameKey)>,
}

impl Challenged {
    /// Takes what the client sent first (`read`, as read from the connection): a `Hello`
    /// whose key `key_for` names for its role (or refuses), answered by the `Challenge` to
    /// send.
    pub(crate) fn from_hello(
        read: Result<Message, WireError>,
        channel: &ChannelBinding,
        key_for: impl FnOnce(&Asked) -> Result<SessionKey, String>,
    ) -> Result<(Challenged, Message), Refusal> {
        let hello = match read {
            // A client of another version sends a Hello of another shape: tell it so.
            Err(WireError::Malformed(e)) => {
                return Err(Refusal::told(
                    format!(
                        "cannot read the client's Hello ({e}): is it an xfer of another \
                         version? This receiver speaks protocol {PROTOCOL_VERSION}"
                    ),
                    AuthError::Protocol,
                ))
            }
            other => other?,
        };
        let Message::Hello {
            magic,
            version,
            role,
            nonce: client_nonce,
            key,
            share: client_share,
            sealed,
        } = hello
        else {
            return Err(
                AuthError::Protocol(format!("expected Hello, got {}", name(&hello))).into(),
            );
        };
        if magic != MAGIC {
            return Err(AuthError::Protocol("not an xfer client".into()).into());
        }
        if version != PROTOCOL_VERSION {
            return Err(Refusal::told(
                format!(
                    "protocol version {version} is not supported (receiver speaks \
                     {PROTOCOL_VERSION})"
                ),
                AuthError::Protocol,
            ));
        }
        let asked = Asked { role, key, sealed };
        let key = key_for(&asked).map_err(|reason| Refusal::told(reason, AuthError::Rejected))?;
        let exchange = Exchange::start()?;
        let said = Said {
            client_nonce,
            server_nonce: random_bytes::<32>(),
            client_share,
            server_share: exchange.share(),
            sealed,
        };
        let secret = exchange.finish(&client_share)?;
        let proof = key.proof(b"server", channel, &said, &asked.role);
        let challenge = Message::Challenge {
            nonce: said.server_nonce,
            share: said.server_share,
            proof: *proof.as_bytes(),
        };
        let challenged = Challenged {
            asked,
            key,
            channel: *channel,
            said,
            secret,
        };
        Ok((challenged, challenge))
    }

    /// Takes the client's answer to the `Challenge` (`read`, as read from the connection):
    /// its proof of the key, which must match.
    pub(crate) fn auth(self, read: Result<Message, WireError>) -> Result<Proven, Refusal> {
        let client_proof = match read? {
            Message::Auth { proof } => proof,
            Message::Refused { reason } => return Err(AuthError::Rejected(reason).into()),
            other => {
                let got = name(&other);
                return Err(AuthError::Protocol(format!("expected Auth, got {got}")).into());
            }
        };
        let Challenged {
            asked,
            key,
            channel,
            said,
            secret,
        } = self;
        if key.proof(b"client", &channel, &said, &asked.role) != blake3::Hash::from(client_proof) {
            return Err(Refusal::told("wrong key".into(), AuthError::Rejected));
        }
        let agreed = Agreed {
            client_nonce: said.client_nonce,
            server_nonce: said.server_nonce,
            secret,
        };
        let frame_keys = asked.sealed.then(|| agreed.frame_keys(&key));
        Ok(Proven {
            asked,
            agreed,
            frame_keys,
        })
    }
}

/// Short name of a message for error texts (never its contents).
///
/// ```
/// use transfer::wire::Message;
///
/// assert_eq!(transfer::auth::name(&Message::Refused { reason: "a secret path".into() }), "Refused");
/// ```
pub fn name(msg: &Message) -> &'static str {
    match msg {
        Message::Hello { .. } => "Hello",
        Message::Challenge { .. } => "Challenge",
        Message::Auth { .. } => "Auth",
        Message::Welcome { .. } => "Welcome",
        Message::Refused { .. } => "Refused",
        Message::Start { .. } => "Start",
        Message::Entries(_) => "Entries",
        Message::Plan { .. } => "Plan",
        Message::Seal { .. } => "Seal",
        Message::Finalized { .. } => "Finalized",
        Message::Compare { .. } => "Compare",
        Message::Compared { .. } => "Compared",
        Message::Finish => "Finish",
        Message::Done { .. } => "Done",
        Message::Fetch { .. } => "Fetch",
        Message::Fetched { .. } => "Fetched",
        Message::Grant { .. } => "Grant",
        Message::Granted { .. } => "Granted",
        Message::Working => "Working",
        Message::Ack { .. } => "Ack",
        Message::Nack { .. } => "Nack",
        Message::EndOfStream => "EndOfStream",
        Message::QuicRequest => "QuicRequest",
        Message::QuicOffer { .. } => "QuicOffer",
        Message::Limited { .. } => "Limited",
        Message::Error { .. } => "Error",
    }
}

/// Where a session key comes from, in configuration files: `{ file = "PATH" }` (readable by
/// its owner only, see [`SessionKey::from_file`]) or `{ text = "KEY" }`; in a program, also a
/// key already read ([`KeySetting::Key`], which a `SessionKey` converts into).
///
/// ```
/// use transfer::auth::KeySetting;
///
/// #[derive(serde::Deserialize)]
/// struct Site {
///     key: KeySetting,
/// }
/// let site: Site = toml::from_str(r#"key = { file = "/etc/xfer/key" }"#).unwrap();
/// assert_eq!(site.key, KeySetting::File("/etc/xfer/key".into()));
/// assert_eq!(format!("{:?}", KeySetting::Text("secret-0123456789".into())), "Text(<hidden>)");
/// ```
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
#[non_exhaustive]
pub enum KeySetting {
    /// A key file.
    File(PathBuf),
    /// The key itself (kept out of `Debug` output).
    Text(String),
    /// A key already read or generated (kept out of `Debug` output, and never written out:
    /// serialising settings that hold one fails).
    #[serde(skip)]
    Key(SessionKey),
}

impl From<SessionKey> for KeySetting {
    fn from(key: SessionKey) -> Self {
        KeySetting::Key(key)
    }
}

impl std::fmt::Debug for KeySetting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KeySetting::File(path) => f.debug_tuple("File").field(path).finish(),
            KeySetting::Text(_) => f.write_str("Text(<hidden>)"),
            KeySetting::Key(_) => f.write_str("Key(<hidden>)"),
        }
    }
}

impl KeySetting {
    /// The key.
    ///
    /// ```
    /// use transfer::auth::KeySetting;
    ///
    /// assert!(KeySetting::Text("a-site-key-0123456789".into()).key().is_ok());
    /// let missing = KeySetting::File("/nonexistent/key".into()).key().unwrap_err();
    /// assert!(missing.to_string().contains("/nonexistent/key"));
    /// ```
    pub fn key(&self) -> Result<SessionKey, AuthError> {
        match self {
            KeySetting::File(path) => SessionKey::from_file(path),
            KeySetting::Text(text) => SessionKey::from_text(text),
            KeySetting::Key(key) => Ok(key.clone()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::net::UnixStream;

    type ServerSide = Result<(Asked, Agreed), AuthError>;

    /// A receiver running `handshake_as_server` with `key_for` on one end of a socket pair
    /// (then `after` on its writer when it succeeds); returns the other end and the thread.
    fn spawn_server(
        key_for: impl FnOnce(&Role) -> Result<SessionKey, String> + Send + 'static,
        after: impl FnOnce(&mut UnixStream) + Send + 'static,
    ) -> (UnixStream, std::thread::JoinHandle<ServerSide>) {
        let (a, b) = UnixStream::pair().unwrap();
        let server = std::thread::spawn(move || {
            let mut reader = FrameReader::new(b.try_clone().unwrap(), 0);
            let mut writer = b;
            let proven =
                handshake_as_server(&mut reader, &mut writer, &ChannelBinding::PLAIN, |asked| {
                    key_for(&asked.role)
                });
            if proven.is_ok() {
                after(&mut writer);
            }
            proven
        });
        (a, server)
    }

    /// The client side of a handshake over `socket`, on a plain channel.
    fn client(socket: UnixStream, key: &SessionKey, role: Role) -> Result<Welcomed, AuthError> {
        let mut reader = FrameReader::new(socket.try_clone().unwrap(), 0);
        let mut writer = socket;
        handshake_as_client(
            &mut reader,
            &mut writer,
            &ChannelBinding::PLAIN,
            key,
            role,
            false,
        )
    }

    fn server_key() -> impl FnOnce(&Role) -> Result<SessionKey, String> {
        |_| Ok(SessionKey::from_text(KEY).unwrap())
    }

    /// One handshake over a socket pair: the server expects `server_key` for every role and
    /// welcomes session `[9; 16]`.
    fn run(
        client_key: &str,
        server_key: &str,
        role: Role,
    ) -> (ServerSide, Result<Welcomed, AuthError>) {
        let server_key = SessionKey::from_text(server_key).unwrap();
        let (a, server) = spawn_server(
            |_| Ok(server_key),
            |writer| {
                let limits = SessionLimits {
                    max_streams: 4,
                    max_chunk: 1024,
                };
                let welcome = Message::Welcome {
                    session: [9; 16],
                    limits,
                };
                crate::wire::write_message(writer, &welcome).unwrap();
            },
        );
        // The client's socket closes when it returns, so the server sees EOF if it gave up.
        let client = client(a, &SessionKey::from_text(client_key).unwrap(), role);
        (server.join().unwrap(), client)
    }

    const KEY: &str = "0123456789abcdef0123";

    #[test]
    fn same_key_authenticates_both_ways_and_both_derive_the_session_key() {
        let (server, client) = run(KEY, KEY, Role::Control);
        let (asked, agreed) = server.unwrap();
        assert_eq!(asked.role, Role::Control);
        let client = client.unwrap();
        assert_eq!(client.session, [9; 16]);
        let derived = SessionKey::from_text(KEY)
            .unwrap()
            .for_session(&agreed, &[9; 16]);
        assert_eq!(client.session_key.mac_key, derived.mac_key);
        assert_ne!(derived.mac_key, SessionKey::from_text(KEY).unwrap().mac_key);
    }

    #[test]
    fn session_keys_differ_between_sessions() {
        let key = SessionKey::from_text(KEY).unwrap();
        let agreed = Agreed {
            client_nonce: [1; 32],
            server_nonce: [2; 32],
            secret: [4; 32],
        };
        let a = key.for_session(&agreed, &[0; 16]).mac_key;
        for other in [
            Agreed {
                server_nonce: [3; 32],
                ..agreed.clone()
            },
            Agreed {
                secret: [5; 32],
                ..agreed.clone()
            },
        ] {
            assert_ne!(a, key.for_session(&other, &[0; 16]).mac_key);
        }
        assert_ne!(a, key.for_session(&agreed, &[1; 16]).mac_key);
    }

    #[test]
    fn wrong_key_is_refused_by_the_client_check() {
        let (server, client) = run(KEY, "ffffffffffffffffffff", Role::Control);
        assert!(client
            .unwrap_err()
            .to_string()
            .contains("does not hold this key"));
        assert!(server.is_err());
    }

    /// A passive observer records a client's `Hello` and `Auth` and plays them back: the
    /// receiver's new nonce makes the recorded proof worthless.
    #[test]
    fn a_replayed_handshake_is_refused() {
        let (a, server) = spawn_server(server_key(), |_| {});
        // Record what the genuine client says on the wire.
        let mut recorded = Vec::new();
        let mut reader = FrameReader::new(a.try_clone().unwrap(), 0);
        struct Tee<'a>(&'a mut Vec<u8>, UnixStream);
        impl Write for Tee<'_> {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                self.0.extend_from_slice(buf);
                self.1.write_all(buf).map(|()| buf.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        impl FrameWrite for Tee<'_> {}
        let key = SessionKey::from_text(KEY).unwrap();
        let mut tee = Tee(&mut recorded, a);
        // The server does not send Welcome here, so the client ends with an error after Auth.
        let _ = handshake_as_client(
            &mut reader,
            &mut tee,
            &ChannelBinding::PLAIN,
            &key,
            Role::Control,
            false,
        );
        drop(tee);
        assert_eq!(server.join().unwrap().unwrap().0.role, Role::Control);

        let (mut replayer, server) = spawn_server(server_key(), |_| {});
        replayer.write_all(&recorded).unwrap();
        let err = server.join().unwrap().unwrap_err();
        assert!(err.to_string().contains("wrong key"), "{err}");
        let mut reader = FrameReader::new(replayer, 0);
        assert!(matches!(
            reader.read_message(),
            Ok(Message::Challenge { .. })
        ));
        assert!(matches!(reader.read_message(), Ok(Message::Refused { .. })));
    }

    /// Issue 40: a key holder who watched a plain handshake learns its nonces and shares, never
    /// the secret behind them, so no key it can derive from what it saw (with the former
    /// derivation from the nonces alone, or with a share taken for the secret) is the session's.
    #[test]
    fn watching_a_handshake_does_not_give_the_session_key() {
        let (server, client) = run(KEY, KEY, Role::Control);
        let (_, agreed) = server.unwrap();
        let session_key = client.unwrap().session_key.mac_key;
        let key = SessionKey::from_text(KEY).unwrap();
        let mut nonces_only = key.mac_key.to_vec();
        nonces_only.extend_from_slice(&agreed.client_nonce);
        nonces_only.extend_from_slice(&agreed.server_nonce);
        nonces_only.extend_from_slice(&[9; 16]);
        assert_ne!(
            blake3::derive_key("xfer v2 session of a receiver key", &nonces_only),
            session_key
        );
        for guess in [[0; 32], agreed.client_nonce, agreed.server_nonce] {
            let seen = Agreed {
                secret: guess,
                ..agreed.clone()
            };
            assert_ne!(key.for_session(&seen, &[9; 16]).mac_key, session_key);
        }
        assert_eq!(key.for_session(&agreed, &[9; 16]).mac_key, session_key);
    }

    /// A peer whose key share makes no secret (a point of low order) is refused.
    #[test]
    fn a_share_of_low_order_is_refused() {
        let exchange = Exchange::start().unwrap();
        assert!(matches!(
            exchange.finish(&[0; 32]),
            Err(AuthError::Protocol(e)) if e.contains("unusable")
        ));
    }

    /// A client's `Hello` for the rules of [`Challenged`], with the exchange that made
    /// its share.
    fn hello(key: &SessionKey, version: u16) -> (Message, Exchange) {
        let exchange = Exchange::start().unwrap();
        let hello = Message::Hello {
            magic: MAGIC,
            version,
            role: Role::Control,
            nonce: [3; 32],
            key: key.id(),
            share: exchange.share(),
            sealed: true,
        };
        (hello, exchange)
    }

    /// The receiver's rules, with no connection: the `Challenge` proves the key, the client's
    /// proof is checked, both sides agree on one secret and the sealed frames' keys; a wrong
    /// proof is refused with "wrong key" told to the client.
    #[test]
    fn the_server_rules_prove_the_key_and_check_the_clients_proof() {
        let key = SessionKey::from_text(KEY).unwrap();
        let channel = ChannelBinding::PLAIN;
        for honest in [true, false] {
            let (hello, exchange) = hello(&key, PROTOCOL_VERSION);
            let Message::Hello { share, .. } = hello else {
                unreachable!()
            };
            let (challenged, challenge) =
                Challenged::from_hello(Ok(hello), &channel, |_| Ok(key.clone())).unwrap();
            let Message::Challenge {
                nonce,
                share: server_share,
                proof,
            } = challenge
            else {
                panic!("{challenge:?}")
            };
            let said = Said {
                client_nonce: [3; 32],
                server_nonce: nonce,
                client_share: share,
                server_share,
                sealed: true,
            };
            let role = Role::Control;
            assert_eq!(
                key.proof(b"server", &channel, &said, &role),
                blake3::Hash::from(proof)
            );
            let client = if honest { b"client" } else { b"server" };
            let proof = *key.proof(client, &channel, &said, &role).as_bytes();
            match challenged.auth(Ok(Message::Auth { proof })) {
                Ok(proven) => {
                    assert!(honest);
                    assert_eq!(
                        proven.agreed.secret,
                        exchange.finish(&server_share).unwrap()
                    );
                    assert!(
                        proven.frame_keys.is_some(),
                        "the client asked for sealed frames"
                    );
                }
                Err(refusal) => {
                    assert!(!honest);
                    assert!(matches!(refusal.error, AuthError::Rejected(_)));
                    assert_eq!(refusal.told.as_deref(), Some("wrong key"));
                }
            }
        }
    }

    /// What the rules tell a client they refuse: why, when it is an xfer client of another
    /// version or its key or role is refused; nothing to a peer that does not say `Hello`.
    #[test]
    fn the_server_rules_tell_a_refused_client_why() {
        let key = SessionKey::from_text(KEY).unwrap();
        let channel = ChannelBinding::PLAIN;
        let refuse = |read, key_for: Result<SessionKey, String>| {
            let refusal = Challenged::from_hello(read, &channel, |_| key_for)
                .err()
                .unwrap();
            refusal.told
        };
        let newer = refuse(Ok(hello(&key, PROTOCOL_VERSION + 1).0), Ok(key.clone())).unwrap();
        assert!(newer.contains("is not supported"), "{newer}");
        let odd = Err(WireError::Malformed("a Hello of another shape".into()));
        let unread = refuse(odd, Ok(key.clone())).unwrap();
        assert!(unread.contains("another version"), "{unread}");
        let role = refuse(
            Ok(hello(&key, PROTOCOL_VERSION).0),
            Err("no such role".into()),
        );
        assert_eq!(role.as_deref(), Some("no such role"));
        assert_eq!(
            refuse(
                Ok(Message::Done {
                    removed: Default::default()
                }),
                Ok(key.clone())
            ),
            None
        );
    }

    /// Both sides' rules against each other, with no connection: each message goes from one
    /// to the other as read; they agree on the sealed frames' keys and the session key, and a
    /// receiver with another key is refused with the reason told to it. What the receiver
    /// sends instead of a challenge is the client's error, with nothing to tell.
    #[test]
    fn the_client_rules_prove_the_key_and_check_the_receivers_proof() {
        let key = SessionKey::from_text(KEY).unwrap();
        let other = SessionKey::from_text("another-receivers-key-0123456789").unwrap();
        let channel = ChannelBinding([7; 32]);
        for receivers in [&key, &other] {
            let (greeting, hello) = Greeting::start(&key, Role::Control, true).unwrap();
            let (challenged, challenge) =
                Challenged::from_hello(Ok(hello), &channel, |_| Ok(receivers.clone())).unwrap();
            let (mut proving, auth) = match greeting.challenge(Ok(challenge), &channel) {
                Ok(answered) => answered,
                Err(refusal) => {
                    assert!(receivers == &other, "refused the right key");
                    assert!(matches!(refusal.error, AuthError::Rejected(_)));
                    assert_eq!(refusal.told.as_deref(), Some(KEY_MISMATCH));
                    continue;
                }
            };
            assert!(receivers == &key, "accepted a wrong key");
            let proven = challenged.auth(Ok(auth)).unwrap();
            let (ours_out, ours_in) = proving.frame_keys.take().unwrap();
            let (theirs_in, theirs_out) = proven.frame_keys.unwrap();
            let tag = |mut k: FrameKey| k.tag(&[b"frame"]);
            assert_eq!(tag(ours_out), tag(theirs_in));
            assert_eq!(tag(ours_in), tag(theirs_out));
            let limits = SessionLimits {
                max_streams: 2,
                max_chunk: 1 << 20,
            };
            let welcomed = proving
                .welcome(Ok(Message::Welcome {
                    session: [4; 16],
                    limits,
                }))
                .unwrap();
            let derived = key.for_session(&proven.agreed, &[4; 16]);
            assert!(
                welcomed.session_key == derived,
                "both derive one session key"
            );
        }
        let (greeting, _) = Greeting::start(&key, Role::Control, false).unwrap();
        let limit = Limit::Sessions { max: 1 };
        let busy = greeting.challenge(Ok(Message::Limited { limit }), &channel);
        let refusal = busy.err().unwrap();
        assert!(matches!(refusal.error, AuthError::Limited(l) if l == limit));
        assert_eq!(refusal.told, None);
    }

    #[test]
    fn a_refused_role_gets_the_reason_before_any_proof() {
        let (a, server) = spawn_server(|_| Err("unknown session".into()), |_| {});
        let key = SessionKey::from_text(KEY).unwrap();
        let client = client(a, &key, Role::Data { session: [1; 16] });
        assert!(matches!(client, Err(AuthError::Refused(r)) if r == "unknown session"));
        assert!(server.join().unwrap().is_err());
    }

    #[test]
    fn a_large_message_before_authentication_is_refused_unread() {
        let (mut writer, server) = spawn_server(server_key(), |_| {});
        let mut frame = ((HANDSHAKE_MESSAGE_LIMIT + 2 + crate::wire::CHECK_LEN) as u32)
            .to_le_bytes()
            .to_vec();
        frame.push(1);
        writer.write_all(&frame).unwrap();
        let err = server.join().unwrap().unwrap_err();
        assert!(err.to_string().contains("oversized"), "{err}");
    }

    #[test]
    fn key_files_readable_by_others_are_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("key");
        std::fs::write(&path, KEY).unwrap();
        for (mode, ok) in [(0o600, true), (0o400, true), (0o640, false), (0o604, false)] {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
            let result = SessionKey::from_file(&path);
            assert_eq!(result.is_ok(), ok, "mode {mode:o}");
            if !ok {
                let text = result.unwrap_err().to_string();
                assert!(text.contains("chmod 600"), "{text}");
            }
        }
    }

    #[test]
    fn short_keys_are_invalid() {
        assert!(SessionKey::from_text("short").is_err());
        let (text, _) = SessionKey::generate();
        assert_eq!(text.len(), 32);
    }
}
