//! Tenants: keys of their own, each with its own root, access and limits, on one receiver. A
//! site runs one daemon on one port for several projects; a client proves one key, and its
//! session can only write below that key's root (or read from it, as the key's [`Access`]
//! allows), within that key's limits.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::{
    check_root_writable, ActivePaths, ReceiverError, ReceiverSettings, DEFAULT_MAX_SESSIONS,
    DEFAULT_MAX_STREAMS,
};
use crate::auth::{KeyId, KeySetting, SessionKey};
use crate::wire::SessionLimits;

/// A key with its own root and limits ([`ReceiverSettings::tenants`]); in a configuration file
/// a `[[tenants]]` table, in which only `max_sessions` and `max_streams` may be left out.
///
/// ```
/// use transfer::auth::SessionKey;
/// use transfer::receiver::{Receiver, ReceiverSettings, Tenant};
///
/// let site = tempfile::tempdir()?;
/// let (own, climate) = (site.path().join("ops"), site.path().join("climate"));
/// std::fs::create_dir_all(&own)?;
/// std::fs::create_dir_all(&climate)?;
/// let mut settings = ReceiverSettings::new(own, SessionKey::generate().1).listen("127.0.0.1:0");
/// let climate_key = SessionKey::from_text("climate-project-key-0123")?;
/// settings.tenants.push(Tenant::new("climate", climate_key, climate).max_sessions(4));
/// let receiver = Receiver::bind(&settings)?;
///
/// let read: ReceiverSettings = toml::from_str(r#"
///     root = "/data/ops"
///     key = { file = "/etc/xfer/ops.key" }
///     [[tenants]]
///     name = "astro"
///     key = { file = "/etc/xfer/astro.key" }
///     root = "/data/astro"
/// "#)?;
/// assert_eq!(read.tenants[0].max_streams, 256, "left out: the default");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct Tenant {
    /// Its name, in logs, events and metrics.
    pub name: String,
    /// The key its senders prove.
    pub key: KeySetting,
    /// Everything its sessions receive lands under this directory, and what they fetch comes
    /// from it.
    pub root: PathBuf,
    /// What its key may do under `root`; in a configuration file `"write"` (the default),
    /// `"read"` or `"read-write"`.
    #[serde(default)]
    pub access: Access,
    /// Most of its sessions served at once (the receiver's `max_sessions` bounds them all).
    #[serde(default = "default_max_sessions")]
    pub max_sessions: usize,
    /// Most data streams one of its sessions may open (further bounded by the receiver's
    /// `session_memory`).
    #[serde(default = "default_max_streams")]
    pub max_streams: u32,
}

fn default_max_sessions() -> usize {
    DEFAULT_MAX_SESSIONS
}

fn default_max_streams() -> u32 {
    DEFAULT_MAX_STREAMS
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
    pub fn new(name: impl Into<String>, key: impl Into<KeySetting>, root: PathBuf) -> Tenant {
        Tenant {
            name: name.into(),
            key: key.into(),
            root,
            access: Access::default(),
            max_sessions: DEFAULT_MAX_SESSIONS,
            max_streams: DEFAULT_MAX_STREAMS,
        }
    }

    /// Sets [`Tenant::access`].
    pub fn access(mut self, access: Access) -> Tenant {
        self.access = access;
        self
    }

    /// Sets [`Tenant::max_sessions`].
    pub fn max_sessions(mut self, sessions: usize) -> Tenant {
        self.max_sessions = sessions;
        self
    }

    /// Sets [`Tenant::max_streams`].
    pub fn max_streams(mut self, streams: u32) -> Tenant {
        self.max_streams = streams;
        self
    }
}

/// What a key may do under its root: send files there, fetch files from it, or both.
///
/// ```
/// use transfer::receiver::Access;
///
/// let read: Access = serde_json::from_str(r#""read-write""#)?;
/// assert!(read.reads() && read.writes());
/// assert!(!Access::default().reads(), "by default a key only sends files to the receiver");
/// # Ok::<(), serde_json::Error>(())
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum Access {
    /// Its holders send files to the receiver, and cannot list or fetch any.
    #[default]
    Write,
    /// Its holders fetch files from under the root, and cannot write any.
    Read,
    /// Both.
    ReadWrite,
}

impl Access {
    /// Whether its holders may fetch files.
    pub fn reads(self) -> bool {
        matches!(self, Access::Read | Access::ReadWrite)
    }

    /// Whether its holders may send files.
    pub fn writes(self) -> bool {
        matches!(self, Access::Write | Access::ReadWrite)
    }
}

impl std::fmt::Display for Access {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Access::Write => "write",
            Access::Read => "read",
            Access::ReadWrite => "read-write",
        })
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
    pub(super) access: Access,
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
    pub(super) fn shown(&self) -> String {
        match &self.name {
            Some(name) => format!("tenant {name}"),
            None => "the receiver's own key".into(),
        }
    }
}

/// A key's root, canonical: a directory, which the receiver must be able to write in if the
/// key may send files there.
fn checked_root(root: &Path, access: Access, direct_io: bool) -> std::io::Result<PathBuf> {
    if access.writes() {
        return check_root_writable(root, direct_io);
    }
    let root = std::fs::canonicalize(root)?;
    match root.is_dir() {
        true => Ok(root),
        false => Err(std::io::Error::new(
            std::io::ErrorKind::NotADirectory,
            "not a directory",
        )),
    }
}

/// Every key `settings` serve, the receiver's own first, each key read and each root checked:
/// no two keys may be the same, nor two roots overlap.
pub(super) fn served(settings: &ReceiverSettings) -> Result<Vec<Served>, ReceiverError> {
    let options = &settings.options;
    let key = settings
        .key
        .key()
        .map_err(|e| ReceiverError::Settings(e.to_string()))?;
    let root =
        checked_root(&settings.root, settings.access, options.direct_io).map_err(|error| {
            ReceiverError::Root {
                path: settings.root.display().to_string(),
                error,
            }
        })?;
    let own = Served {
        name: None,
        id: key.id(),
        key,
        root,
        access: settings.access,
        max_sessions: options.max_sessions,
        limits: options.announced_limits(options.max_streams)?,
        sessions_open: AtomicUsize::new(0),
        active: Arc::default(),
    };
    let mut all = vec![own];
    let mut ids: HashSet<KeyId> = HashSet::from([all[0].id]);
    for tenant in &settings.tenants {
        let key = tenant
            .key
            .key()
            .map_err(|e| ReceiverError::Settings(format!("tenant {}: {e}", tenant.name)))?;
        let id = key.id();
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
        let root =
            checked_root(&tenant.root, tenant.access, options.direct_io).map_err(|error| {
                ReceiverError::Root {
                    path: tenant.root.display().to_string(),
                    error,
                }
            })?;
        all.push(Served {
            name: Some(tenant.name.clone()),
            key,
            id,
            root,
            access: tenant.access,
            max_sessions: tenant.max_sessions,
            limits: options.announced_limits(tenant.max_streams)?,
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
