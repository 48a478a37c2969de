//! One-time credentials for third-party transfers: a client holding a key with write access
//! asks for one (`Grant`), naming the directory under the key's root it is for, and hands the
//! key it gets (`Granted`) to the host that is to send there, never its own key. The receiver
//! accepts the credential for one session, to that directory only, within
//! [`GRANT_LIFETIME`]; its data streams prove the session's key, as every session's do.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

use crate::auth::{KeyId, SessionKey};
use crate::sync::unpoisoned;
use crate::wire::GRANT_LIFETIME;

/// Most credentials waiting for their session at once: a client that asks for more is refused
/// until some are used or expire.
const MAX_GRANTS: usize = 256;

/// A credential waiting for its session.
struct Grant {
    /// The key served that granted it.
    tenant: usize,
    key: SessionKey,
    /// The directory its session must write to.
    dest: Vec<u8>,
    expires: Instant,
}

/// The credentials waiting for their sessions.
#[derive(Default)]
pub(super) struct Grants(Mutex<HashMap<KeyId, Grant>>);

/// What a proven credential gives its session.
pub(super) struct Granted {
    /// The key served that granted it, whose root and limits the session has.
    pub(super) tenant: usize,
    /// The credential, which the session's own key is derived from.
    pub(super) key: SessionKey,
    /// The directory it must write to.
    pub(super) dest: Vec<u8>,
}

impl Grants {
    /// A new credential for one session of `tenant`'s to `dest`, as text; refused while
    /// [`MAX_GRANTS`] are waiting.
    pub(super) fn grant(
        &self,
        tenant: usize,
        dest: Vec<u8>,
        now: Instant,
    ) -> Result<String, String> {
        let mut grants = unpoisoned(self.0.lock());
        grants.retain(|_, grant| grant.expires > now);
        if grants.len() >= MAX_GRANTS {
            return Err(format!(
                "{MAX_GRANTS} one-time credentials are waiting for their sessions already: try \
                 again once some are used"
            ));
        }
        let (text, key) = SessionKey::generate();
        let grant = Grant {
            tenant,
            key: key.clone(),
            dest,
            expires: now + GRANT_LIFETIME,
        };
        grants.insert(key.id(), grant);
        Ok(text)
    }

    /// The key a `Hello` naming `id` proves while the credential waits (a handshake, which
    /// may still fail, does not use it up).
    pub(super) fn key(&self, id: &KeyId, now: Instant) -> Option<SessionKey> {
        let grants = unpoisoned(self.0.lock());
        let grant = grants.get(id).filter(|grant| grant.expires > now)?;
        Some(grant.key.clone())
    }

    /// Uses up the credential `id` once its holder proved it: what its session may do, or
    /// `None` if another connection used it first or it expired.
    pub(super) fn take(&self, id: &KeyId, now: Instant) -> Option<Granted> {
        let grant = unpoisoned(self.0.lock()).remove(id)?;
        (grant.expires > now).then_some(Granted {
            tenant: grant.tenant,
            key: grant.key,
            dest: grant.dest,
        })
    }
}

/// `dest` checked as a granted directory: relative, without `..` (and in the one spelling
/// manifest paths have, so that two names of one directory compare equal).
pub(super) fn directory(dest: &[u8]) -> Result<Vec<u8>, String> {
    crate::manifest::split_relative(dest, true).map_err(|e| e.to_string())?;
    Ok(dest.to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_credential_serves_one_session_within_its_lifetime() {
        let grants = Grants::default();
        let now = Instant::now();
        let text = grants.grant(1, b"in/run7".to_vec(), now).unwrap();
        let id = SessionKey::from_text(&text).unwrap().id();
        assert_eq!(grants.key(&id, now).map(|key| key.id()), Some(id));
        let granted = grants.take(&id, now).expect("the first use");
        assert_eq!((granted.tenant, granted.dest), (1, b"in/run7".to_vec()));
        assert!(grants.take(&id, now).is_none(), "used once");
        assert!(grants.key(&id, now).is_none());

        let late = grants.grant(0, Vec::new(), now).unwrap();
        let id = SessionKey::from_text(&late).unwrap().id();
        let after = now + GRANT_LIFETIME;
        assert!(grants.key(&id, after).is_none() && grants.take(&id, after).is_none());
    }

    #[test]
    fn a_granted_directory_is_relative_and_spelt_one_way() {
        assert_eq!(directory(b"in/run7").unwrap(), b"in/run7");
        assert_eq!(directory(b"").unwrap(), b"");
        for refused in [&b"../up"[..], b"/abs", b"in//run7", b"in/run7/"] {
            assert!(directory(refused).is_err(), "{refused:?}");
        }
    }

    #[test]
    fn credentials_waiting_are_bounded() {
        let grants = Grants::default();
        let now = Instant::now();
        for _ in 0..MAX_GRANTS {
            grants.grant(0, Vec::new(), now).unwrap();
        }
        assert!(grants.grant(0, Vec::new(), now).is_err());
        // Expired ones make room.
        assert!(grants.grant(0, Vec::new(), now + GRANT_LIFETIME).is_ok());
    }
}
