//! Session keys and the mutual challenge-response handshake every connection starts with.
//!
//! The secret never crosses the wire: each side proves it knows the key with a BLAKE3 keyed hash
//! over both sides' fresh nonces, the connection's role, and a label saying who is proving. A
//! client without the key is refused before it can send a single data byte; a client also
//! checks the receiver's proof, so it never sends data to an impostor that merely accepted the
//! connection.

use std::io::{Read, Write};
use std::path::Path;

use crate::wire::{FrameReader, Message, Role, SessionLimits, WireError, MAGIC, PROTOCOL_VERSION};

/// Fewest characters accepted in a session key.
pub const MIN_KEY_LEN: usize = 16;

/// Errors of key handling and of the handshake.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    /// The key text is unusable.
    #[error("invalid key: {0}")]
    InvalidKey(String),
    /// The key file could not be read.
    #[error("cannot read key file {path}: {source}")]
    KeyFile {
        /// The file.
        path: String,
        /// The cause.
        source: std::io::Error,
    },
    /// The peer's proof did not match: it does not hold the same key.
    #[error("authentication failed: {0}")]
    Rejected(String),
    /// The peer refused the connection with this reason.
    #[error("receiver refused the connection: {0}")]
    Refused(String),
    /// The peer spoke something that is not this protocol.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// Framing or socket failure during the handshake.
    #[error(transparent)]
    Wire(#[from] WireError),
}

/// A session key: the MAC key derived from the secret text a receiver prints or reads from a file.
#[derive(Clone)]
pub struct SessionKey {
    mac_key: [u8; 32],
}

impl std::fmt::Debug for SessionKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SessionKey(..)")
    }
}

impl SessionKey {
    /// Makes a fresh random key; returns its printable text (32 hex digits, 128 bits) and the key.
    pub fn generate() -> (String, SessionKey) {
        let text: String = random_bytes::<16>()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let key = SessionKey::from_text(&text).expect("a generated key is valid");
        (text, key)
    }

    /// Derives the key from its text (surrounding white space ignored).
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

    /// Reads the key text from a file.
    pub fn from_file(path: &Path) -> Result<SessionKey, AuthError> {
        let text = std::fs::read_to_string(path).map_err(|source| AuthError::KeyFile {
            path: path.display().to_string(),
            source,
        })?;
        SessionKey::from_text(&text)
    }

    fn proof(
        &self,
        who: &[u8],
        client_nonce: &[u8; 32],
        server_nonce: &[u8; 32],
        role: &Role,
    ) -> blake3::Hash {
        let mut mac = blake3::Hasher::new_keyed(&self.mac_key);
        mac.update(who);
        mac.update(client_nonce);
        mac.update(server_nonce);
        match role {
            Role::Control => mac.update(b"control"),
            Role::Data { session } => mac.update(b"data").update(session),
        };
        mac.finalize()
    }
}

/// What a client learns from `Welcome`: the session id and the receiver's limits.
pub type Welcomed = ([u8; 16], SessionLimits);

/// Fills an array from the operating system's random source.
pub fn random_bytes<const N: usize>() -> [u8; N] {
    let mut out = [0u8; N];
    getrandom::fill(&mut out).expect("the operating system's random source failed");
    out
}

/// The client side of the handshake over a reader and a writer of the same connection.
pub fn handshake_as_client<R: Read, W: Write>(
    reader: &mut FrameReader<R>,
    writer: &mut W,
    key: &SessionKey,
    role: Role,
) -> Result<Welcomed, AuthError> {
    let client_nonce = random_bytes::<32>();
    crate::wire::write_message(
        writer,
        &Message::Hello {
            magic: MAGIC,
            version: PROTOCOL_VERSION,
            role: role.clone(),
            nonce: client_nonce,
        },
    )?;
    let (server_nonce, server_proof) = match reader.read_message()? {
        Message::Challenge { nonce, proof } => (nonce, proof),
        Message::Refused { reason } => return Err(AuthError::Refused(reason)),
        other => {
            return Err(AuthError::Protocol(format!(
                "expected Challenge, got {}",
                name(&other)
            )))
        }
    };
    if key.proof(b"server", &client_nonce, &server_nonce, &role) != blake3::Hash::from(server_proof)
    {
        return Err(AuthError::Rejected(
            "the receiver does not hold this key (check --key)".into(),
        ));
    }
    let proof = key.proof(b"client", &client_nonce, &server_nonce, &role);
    crate::wire::write_message(
        writer,
        &Message::Auth {
            proof: *proof.as_bytes(),
        },
    )?;
    match reader.read_message()? {
        Message::Welcome { session, limits } => Ok((session, limits)),
        Message::Refused { reason } => Err(AuthError::Refused(reason)),
        other => Err(AuthError::Protocol(format!(
            "expected Welcome, got {}",
            name(&other)
        ))),
    }
}

/// The receiver side of the handshake, up to (not including) `Welcome`: returns the proven role.
///
/// On a wrong proof it sends `Refused` and fails, so the caller drops the connection before
/// reading anything else from it.
pub fn handshake_as_server<R: Read, W: Write>(
    reader: &mut FrameReader<R>,
    writer: &mut W,
    key: &SessionKey,
) -> Result<Role, AuthError> {
    let (role, client_nonce) = match reader.read_message()? {
        Message::Hello {
            magic,
            version,
            role,
            nonce,
        } => {
            if magic != MAGIC {
                return Err(AuthError::Protocol("not an xfer client".into()));
            }
            if version != PROTOCOL_VERSION {
                let reason = format!(
                    "protocol version {version} is not supported (receiver speaks {PROTOCOL_VERSION})"
                );
                let _ = crate::wire::write_message(
                    writer,
                    &Message::Refused {
                        reason: reason.clone(),
                    },
                );
                return Err(AuthError::Protocol(reason));
            }
            (role, nonce)
        }
        other => {
            return Err(AuthError::Protocol(format!(
                "expected Hello, got {}",
                name(&other)
            )))
        }
    };
    let server_nonce = random_bytes::<32>();
    let proof = key.proof(b"server", &client_nonce, &server_nonce, &role);
    crate::wire::write_message(
        writer,
        &Message::Challenge {
            nonce: server_nonce,
            proof: *proof.as_bytes(),
        },
    )?;
    let client_proof = match reader.read_message()? {
        Message::Auth { proof } => proof,
        other => {
            return Err(AuthError::Protocol(format!(
                "expected Auth, got {}",
                name(&other)
            )))
        }
    };
    if key.proof(b"client", &client_nonce, &server_nonce, &role) != blake3::Hash::from(client_proof)
    {
        let reason = "wrong key".to_string();
        let _ = crate::wire::write_message(
            writer,
            &Message::Refused {
                reason: reason.clone(),
            },
        );
        return Err(AuthError::Rejected(reason));
    }
    Ok(role)
}

/// Short name of a message for error texts (never its contents).
pub fn name(msg: &Message) -> &'static str {
    match msg {
        Message::Hello { .. } => "Hello",
        Message::Challenge { .. } => "Challenge",
        Message::Auth { .. } => "Auth",
        Message::Welcome { .. } => "Welcome",
        Message::Refused { .. } => "Refused",
        Message::Manifest(_) => "Manifest",
        Message::Plan(_) => "Plan",
        Message::Seal { .. } => "Seal",
        Message::Finalized { .. } => "Finalized",
        Message::Finish => "Finish",
        Message::Done => "Done",
        Message::Ack { .. } => "Ack",
        Message::Nack { .. } => "Nack",
        Message::EndOfStream => "EndOfStream",
        Message::Error { .. } => "Error",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixStream;

    fn run(
        client_key: &str,
        server_key: &str,
    ) -> (Result<Role, AuthError>, Result<Welcomed, AuthError>) {
        let (a, b) = UnixStream::pair().unwrap();
        let server_key = SessionKey::from_text(server_key).unwrap();
        let server = std::thread::spawn(move || {
            let mut reader = FrameReader::new(b.try_clone().unwrap(), 0);
            let mut writer = b;
            let role = handshake_as_server(&mut reader, &mut writer, &server_key);
            if role.is_ok() {
                let limits = SessionLimits {
                    max_streams: 4,
                    max_chunk: 1024,
                };
                crate::wire::write_message(
                    &mut writer,
                    &Message::Welcome {
                        session: [9; 16],
                        limits,
                    },
                )
                .unwrap();
            }
            role
        });
        let client_key = SessionKey::from_text(client_key).unwrap();
        let mut reader = FrameReader::new(a.try_clone().unwrap(), 0);
        let mut writer = a;
        let client = handshake_as_client(&mut reader, &mut writer, &client_key, Role::Control);
        drop((reader, writer)); // the server sees EOF when the client gives up
        (server.join().unwrap(), client)
    }

    #[test]
    fn same_key_authenticates_both_ways() {
        let (server, client) = run("0123456789abcdef0123", "0123456789abcdef0123");
        assert_eq!(server.unwrap(), Role::Control);
        assert_eq!(client.unwrap().0, [9; 16]);
    }

    #[test]
    fn wrong_key_is_refused_by_the_client_check() {
        let (server, client) = run("0123456789abcdef0123", "ffffffffffffffffffff");
        assert!(client
            .unwrap_err()
            .to_string()
            .contains("does not hold this key"));
        assert!(server.is_err());
    }

    #[test]
    fn short_keys_are_invalid() {
        assert!(SessionKey::from_text("short").is_err());
        let (text, _) = SessionKey::generate();
        assert_eq!(text.len(), 32);
    }
}
