//! Tenants: keys of their own, each with its own root and limits, on one receiver. A site runs
//! one daemon on one port for several projects; a sender proves one key, and its session can
//! only write below that key's root, within that key's limits.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;

use super::{check_root_writable, ActivePaths, ReceiverConfig, ReceiverError};
use crate::auth::{KeyId, SessionKey};
use crate::wire::SessionLimits;

/// A key with its own root and limits ([`ReceiverConfig::tenants`]).
///
/// ```
/// use transfer::auth::SessionKey;
/// use transfer::receiver::{Receiver, ReceiverConfig, Tenant};
///
/// let site = tempfile::tempdir()?;
/// let (own, climate) = (site.path().join("ops"), site.path().join("climate"));
/// std::fs::create_dir_all(&own)?;
/// std::fs::create_dir_all(&climate)?;
/// let mut config = ReceiverConfig::new(own, SessionKey::generate().1);
/// config.tenants.push(Tenant {
///     max_sessions: 4,
///     ..Tenant::new("climate", SessionKey::from_text("climate-project-key-0123")?, climate)
/// });
/// let receiver = Receiver::bind("127.0.0.1:0", config)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct Tenant {
    /// Its name, in logs, events and metrics.
    pub name: String,
    /// The key its senders prove.
    pub key: SessionKey,
    /// Everything its sessions receive lands under this directory.
    pub root: PathBuf,
    /// Most of its sessions served at once (the receiver's `max_sessions` bounds them all).
    pub max_sessions: usize,
    /// Most data streams one of its sessions may open (further bounded by the receiver's
    /// `session_memory`).
    pub max_streams: u32,
}

impl Tenant {
    /// A tenant called `name` whose senders hold `key`, served under `root`, with the
    /// receiver's default limits.
    ///
    /// ```
    /// use transfer::auth::SessionKey;
    /// use transfer::receiver::{Tenant, DEFAULT_MAX_SESSIONS};
    ///
    /// let (_, key) = SessionKey::generate();
    /// let tenant = Tenant::new("astro", key, "/data/astro".into());
    /// assert_eq!(tenant.max_sessions, DEFAULT_MAX_SESSIONS);
    /// ```
    pub fn new(name: impl Into<String>, key: SessionKey, root: PathBuf) -> Tenant {
        Tenant {
            name: name.into(),
            key,
            root,
            max_sessions: super::DEFAULT_MAX_SESSIONS,
            max_streams: super::DEFAULT_MAX_STREAMS,
        }
    }
}

/// A key the receiver serves, as it serves it: the receiver's own (no name) or a tenant's.
pub(super) struct Served {
    /// The tenant's name; `None` for the receiver's own key and root.
    pub(super) name: Option<String>,
    pub(super) key: SessionKey,
    /// How senders name `key` in their `Hello`.
    pub(super) id: KeyId,
    /// Canonical.
    pub(super) root: PathBuf,
    pub(super) max_sessions: usize,
    /// What its sessions are told and held to.
    pub(super) limits: SessionLimits,
    /// Its sessions being served.
    pub(super) sessions_open: AtomicUsize,
    /// The paths under its root that its sessions are writing.
    pub(super) active: Arc<ActivePaths>,
}

impl Served {
    /// How messages name it.
    fn shown(&self) -> String {
        match &self.name {
            Some(name) => format!("tenant {name}"),
            None => "the receiver's own key".into(),
        }
    }
}

/// Every key `config` serves, its own first, each root checked: no two keys may be the same.
pub(super) fn served(config: &ReceiverConfig) -> Result<Vec<Served>, ReceiverError> {
    let own = Served {
        name: None,
        key: config.key.clone(),
        id: config.key.id(),
        root: config.root.clone(),
        max_sessions: config.max_sessions,
        limits: config.announced_limits(config.limits.max_streams)?,
        sessions_open: AtomicUsize::new(0),
        active: Arc::default(),
    };
    let mut all = vec![own];
    let mut ids: HashSet<KeyId> = HashSet::from([all[0].id]);
    for tenant in &config.tenants {
        let id = tenant.key.id();
        if !ids.insert(id) {
            return Err(ReceiverError::Settings(format!(
                "tenant {} has the key of the receiver or of another tenant: each needs its own",
                tenant.name
            )));
        }
        if tenant.max_sessions == 0 || tenant.max_streams == 0 {
            return Err(ReceiverError::Settings(format!(
                "tenant {}: max_sessions and max_streams must be at least 1",
                tenant.name
            )));
        }
        let root = check_root_writable(&tenant.root, config.direct_io).map_err(|error| {
            ReceiverError::Root {
                path: tenant.root.display().to_string(),
                error,
            }
        })?;
        all.push(Served {
            name: Some(tenant.name.clone()),
            key: tenant.key.clone(),
            id,
            root,
            max_sessions: tenant.max_sessions,
            limits: config.announced_limits(tenant.max_streams)?,
            sessions_open: AtomicUsize::new(0),
            active: Arc::default(),
        });
    }
    // Apart, so that no key reaches another's files (and claims under one root cover them).
    for (i, a) in all.iter().enumerate() {
        for b in &all[i + 1..] {
            if a.root.starts_with(&b.root) || b.root.starts_with(&a.root) {
                return Err(ReceiverError::Settings(format!(
                    "the roots of {} ({}) and {} ({}) overlap: each key needs a root of its own",
                    a.shown(),
                    a.root.display(),
                    b.shown(),
                    b.root.display()
                )));
            }
        }
    }
    Ok(all)
}
