//! The id of a session, as both ends know it: the receiver picks it at random when a sender's
//! control connection is authenticated, so a sender's [`crate::sender::Summary`] and the
//! receiver's [`crate::receiver::SessionReport`] of one transfer carry the same id.

use std::fmt;

use serde::{Deserialize, Serialize};

/// A session's 16-byte id. It prints as 32 hex digits; logs show its first 8
/// ([`SessionId::short`]). It serialises as that text.
///
/// ```
/// use transfer::session_id::SessionId;
///
/// let id = SessionId([0xab; 16]);
/// assert_eq!(id.to_string(), "ab".repeat(16));
/// assert_eq!(id.short(), "abababab");
/// assert_eq!(id.to_string().parse::<SessionId>().unwrap(), id);
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(into = "String", try_from = "String")]
pub struct SessionId(pub [u8; 16]);

impl SessionId {
    /// The first 4 bytes in hex: how the receiver's log lines name the session.
    ///
    /// ```
    /// use transfer::session_id::SessionId;
    ///
    /// let id: SessionId = "0123456789abcdef0123456789abcdef".parse()?;
    /// assert_eq!(id.short(), "01234567");
    /// # Ok::<(), String>(())
    /// ```
    pub fn short(&self) -> String {
        hex(&self.0[..4])
    }
}

/// Bytes as lower-case hex digits.
fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl fmt::Display for SessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex(&self.0))
    }
}

impl fmt::Debug for SessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SessionId({self})")
    }
}

impl std::str::FromStr for SessionId {
    type Err = String;

    /// Reads the 32 hex digits [`SessionId`]'s `Display` writes.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let wrong = || format!("a session id is 32 hex digits, not {text:?}");
        if text.len() != 32 || !text.is_ascii() {
            return Err(wrong());
        }
        let mut id = [0u8; 16];
        for (byte, pair) in id.iter_mut().zip(text.as_bytes().chunks(2)) {
            let digits = std::str::from_utf8(pair).map_err(|_| wrong())?;
            *byte = u8::from_str_radix(digits, 16).map_err(|_| wrong())?;
        }
        Ok(SessionId(id))
    }
}

impl From<SessionId> for String {
    fn from(id: SessionId) -> String {
        id.to_string()
    }
}

impl TryFrom<String> for SessionId {
    type Error = String;

    fn try_from(text: String) -> Result<Self, Self::Error> {
        text.parse()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn an_id_reads_back_from_its_text(bytes in any::<[u8; 16]>()) {
            let id = SessionId(bytes);
            prop_assert_eq!(id.to_string().parse::<SessionId>(), Ok(id));
        }
    }

    #[test]
    fn text_that_is_not_an_id_is_refused() {
        for text in ["", "abc", &"g".repeat(32), &"a".repeat(33), &"é".repeat(16)] {
            assert!(text.parse::<SessionId>().is_err(), "{text:?}");
        }
    }
}
