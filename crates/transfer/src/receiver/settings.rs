//! A receiver's settings as a service or `xfer recv --config` keeps them: serde-readable, with
//! the defaults of [`ReceiverConfig::new`] for every field left out.
//!
//! ```
//! use transfer::receiver::ReceiverSettings;
//!
//! let settings: ReceiverSettings = toml::from_str(r#"
//!     listen = "0.0.0.0:9000"
//!     root = "/data/incoming"
//!     key = { file = "/etc/xfer/key" }
//!     max_sessions = 100
//!     shutdown_grace = "10m"
//! "#).unwrap();
//! assert_eq!(settings.max_streams, 256);
//! ```

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{
    Receiver, ReceiverConfig, ReceiverError, Tenant, DEFAULT_HANDSHAKE_TIMEOUT,
    DEFAULT_IDLE_TIMEOUT, DEFAULT_MAX_HANDSHAKES, DEFAULT_MAX_HANDSHAKES_PER_SOURCE,
    DEFAULT_MAX_SESSIONS, DEFAULT_MAX_STREAMS, DEFAULT_SESSION_MEMORY,
};
use crate::auth::KeySetting;
use crate::transport::Transport;

/// Everything a receiver needs; only `root` and `key` must be given.
///
/// ```
/// use transfer::receiver::ReceiverSettings;
///
/// let settings: ReceiverSettings = toml::from_str(r#"
///     root = "/data/incoming"
///     key = { file = "/etc/xfer/key" }
///     transport = "mptcp"
///     require_encryption = true
/// "#)?;
/// assert_eq!(settings.listen, "0.0.0.0:9000");
/// // Written back, e.g. to show the settings in effect.
/// assert!(toml::to_string(&settings)?.contains("max_sessions = 32"));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReceiverSettings {
    /// Address and port to listen on (one port serves control and all data streams).
    #[serde(default = "default_listen")]
    pub listen: String,
    /// Directory everything received is written under.
    pub root: PathBuf,
    /// The key senders must prove they hold.
    pub key: KeySetting,
    /// `"tcp"`, `"mptcp"` or `"quic"` ([`ReceiverConfig::transport`]).
    #[serde(default)]
    pub transport: Transport,
    /// Serve only encrypted sessions.
    #[serde(default)]
    pub require_encryption: bool,
    /// Serve only sessions whose integrity is protected ([`ReceiverConfig::require_integrity`]).
    #[serde(default)]
    pub require_integrity: bool,
    /// Write with direct I/O ([`ReceiverConfig::direct_io`]).
    #[serde(default)]
    pub direct_io: bool,
    /// Most data streams one session may open.
    #[serde(default = "default_max_streams")]
    pub max_streams: u32,
    /// Most sessions served at once; more are refused with the reason.
    #[serde(default = "default_max_sessions")]
    pub max_sessions: usize,
    /// Most bytes of chunk buffers one session may hold ([`ReceiverConfig::session_memory`]).
    #[serde(default = "default_session_memory")]
    pub session_memory: u64,
    /// How long a session may go without receiving a byte before it is closed.
    #[serde(default = "default_idle_timeout", with = "crate::duration")]
    pub idle_timeout: Duration,
    /// How long a new connection may take to authenticate
    /// ([`ReceiverConfig::handshake_timeout`]).
    #[serde(default = "default_handshake_timeout", with = "crate::duration")]
    pub handshake_timeout: Duration,
    /// Most connections in their key handshake at once ([`ReceiverConfig::max_handshakes`]).
    #[serde(default = "default_max_handshakes")]
    pub max_handshakes: usize,
    /// Most of them from one address ([`ReceiverConfig::max_handshakes_per_source`]).
    #[serde(default = "default_max_handshakes_per_source")]
    pub max_handshakes_per_source: usize,
    /// How long the sessions running when the receiver is asked to stop may take to finish
    /// ([`super::Stopper::stop`]; zero ends them at once); `xfer recv` stops so on SIGTERM or
    /// SIGINT.
    #[serde(default = "default_shutdown_grace", with = "crate::duration")]
    pub shutdown_grace: Duration,
    /// Keys of their own, each with its own root and limits (`[[tenants]]` tables).
    #[serde(default)]
    pub tenants: Vec<TenantSettings>,
}

/// A tenant ([`super::Tenant`]) as a configuration file keeps it; only `max_sessions` and
/// `max_streams` may be left out.
///
/// ```
/// use transfer::receiver::ReceiverSettings;
///
/// let settings: ReceiverSettings = toml::from_str(r#"
///     root = "/data/ops"
///     key = { file = "/etc/xfer/ops.key" }
///
///     [[tenants]]
///     name = "climate"
///     key = { file = "/etc/xfer/climate.key" }
///     root = "/data/climate"
///     max_sessions = 8
///
///     [[tenants]]
///     name = "astro"
///     key = { file = "/etc/xfer/astro.key" }
///     root = "/data/astro"
/// "#)?;
/// assert_eq!(settings.tenants.len(), 2);
/// assert_eq!(settings.tenants[1].max_streams, 256, "left out: the default");
/// # Ok::<(), toml::de::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantSettings {
    /// Its name, in logs, events and metrics.
    pub name: String,
    /// The key its senders prove.
    pub key: KeySetting,
    /// Directory its sessions' files land under.
    pub root: PathBuf,
    /// Most of its sessions served at once.
    #[serde(default = "default_max_sessions")]
    pub max_sessions: usize,
    /// Most data streams one of its sessions may open.
    #[serde(default = "default_max_streams")]
    pub max_streams: u32,
}

impl TenantSettings {
    /// The tenant (its key read).
    ///
    /// ```
    /// use transfer::auth::KeySetting;
    /// use transfer::receiver::TenantSettings;
    ///
    /// let settings = TenantSettings {
    ///     name: "astro".into(),
    ///     key: KeySetting::File("/nonexistent/astro.key".into()),
    ///     root: "/data/astro".into(),
    ///     max_sessions: 4,
    ///     max_streams: 64,
    /// };
    /// let e = settings.tenant().unwrap_err().to_string();
    /// assert!(e.contains("tenant astro") && e.contains("/nonexistent/astro.key"), "{e}");
    /// ```
    pub fn tenant(&self) -> Result<Tenant, ReceiverError> {
        let key = self
            .key
            .key()
            .map_err(|e| ReceiverError::Settings(format!("tenant {}: {e}", self.name)))?;
        Ok(Tenant {
            max_sessions: self.max_sessions,
            max_streams: self.max_streams,
            ..Tenant::new(self.name.clone(), key, self.root.clone())
        })
    }
}

fn default_listen() -> String {
    "0.0.0.0:9000".into()
}

fn default_max_streams() -> u32 {
    DEFAULT_MAX_STREAMS
}

fn default_max_sessions() -> usize {
    DEFAULT_MAX_SESSIONS
}

fn default_session_memory() -> u64 {
    DEFAULT_SESSION_MEMORY
}

fn default_idle_timeout() -> Duration {
    DEFAULT_IDLE_TIMEOUT
}

fn default_handshake_timeout() -> Duration {
    DEFAULT_HANDSHAKE_TIMEOUT
}

fn default_max_handshakes() -> usize {
    DEFAULT_MAX_HANDSHAKES
}

fn default_max_handshakes_per_source() -> usize {
    DEFAULT_MAX_HANDSHAKES_PER_SOURCE
}

fn default_shutdown_grace() -> Duration {
    Duration::from_secs(60)
}

/// A time setting that must not be zero, checked.
fn positive(name: &str, time: Duration) -> Result<Duration, ReceiverError> {
    crate::duration::positive(name, time).map_err(ReceiverError::Settings)
}

impl ReceiverSettings {
    /// Settings with every default, to serve `root` to senders that hold `key`.
    ///
    /// ```
    /// use transfer::auth::KeySetting;
    /// use transfer::receiver::ReceiverSettings;
    ///
    /// let mut settings = ReceiverSettings::new("/data/incoming".into(), KeySetting::File("/etc/xfer/key".into()));
    /// settings.listen = "10.0.0.1:9000".into();
    /// settings.max_sessions = 100;
    /// ```
    pub fn new(root: PathBuf, key: KeySetting) -> Self {
        ReceiverSettings {
            listen: default_listen(),
            root,
            key,
            transport: Transport::default(),
            require_encryption: false,
            require_integrity: false,
            direct_io: false,
            max_streams: default_max_streams(),
            max_sessions: default_max_sessions(),
            session_memory: default_session_memory(),
            idle_timeout: default_idle_timeout(),
            handshake_timeout: default_handshake_timeout(),
            max_handshakes: default_max_handshakes(),
            max_handshakes_per_source: default_max_handshakes_per_source(),
            shutdown_grace: default_shutdown_grace(),
            tenants: Vec::new(),
        }
    }

    /// The receiver's configuration (the key read, every value checked).
    ///
    /// ```
    /// use std::time::Duration;
    /// use transfer::auth::KeySetting;
    /// use transfer::receiver::ReceiverSettings;
    ///
    /// let mut settings = ReceiverSettings::new(
    ///     "/data/incoming".into(),
    ///     KeySetting::Text("a-site-key-0123456789".into()),
    /// );
    /// settings.idle_timeout = Duration::from_secs(90);
    /// assert_eq!(settings.config()?.idle_timeout, Duration::from_secs(90));
    /// settings.idle_timeout = Duration::ZERO;
    /// assert!(settings.config().unwrap_err().to_string().contains("idle_timeout"));
    /// # Ok::<(), transfer::receiver::ReceiverError>(())
    /// ```
    pub fn config(&self) -> Result<ReceiverConfig, ReceiverError> {
        let key = self
            .key
            .key()
            .map_err(|e| ReceiverError::Settings(e.to_string()))?;
        if self.max_streams == 0 || self.max_sessions == 0 {
            return Err(ReceiverError::Settings(
                "max_streams and max_sessions must be at least 1".into(),
            ));
        }
        let mut config = ReceiverConfig::new(self.root.clone(), key);
        config.transport = self.transport;
        config.require_encryption = self.require_encryption;
        config.require_integrity = self.require_integrity;
        config.direct_io = self.direct_io;
        config.limits.max_streams = self.max_streams;
        config.max_sessions = self.max_sessions;
        config.session_memory = self.session_memory;
        config.idle_timeout = positive("idle_timeout", self.idle_timeout)?;
        config.handshake_timeout = positive("handshake_timeout", self.handshake_timeout)?;
        config.max_handshakes = self.max_handshakes;
        config.max_handshakes_per_source = self.max_handshakes_per_source;
        config.tenants = self
            .tenants
            .iter()
            .map(TenantSettings::tenant)
            .collect::<Result<_, _>>()?;
        Ok(config)
    }

    /// Checks the settings and binds the receiver ([`Receiver::bind`]).
    ///
    /// ```
    /// use transfer::auth::KeySetting;
    /// use transfer::receiver::ReceiverSettings;
    ///
    /// let root = tempfile::tempdir()?;
    /// let mut settings = ReceiverSettings::new(root.path().into(), KeySetting::Text("a-site-key-0123456789".into()));
    /// settings.listen = "127.0.0.1:0".into();
    /// let receiver = settings.bind()?;
    /// assert!(receiver.local_addr()?.port() > 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn bind(&self) -> Result<Receiver, ReceiverError> {
        Receiver::bind(&self.listen, self.config()?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_read_from_a_file_and_bad_values_are_named() {
        let root = tempfile::tempdir().unwrap();
        let text = format!(
            "listen = \"127.0.0.1:0\"\nroot = \"{}\"\nkey = {{ text = \"receiver-settings-test-key-0123\" }}\n\
             max_sessions = 100\nidle_timeout = \"5s\"\n",
            root.path().display()
        );
        let settings: ReceiverSettings = toml::from_str(&text).unwrap();
        assert!(!format!("{settings:?}").contains("receiver-settings-test-key"));
        let config = settings.config().unwrap();
        assert_eq!(config.max_sessions, 100);
        assert_eq!(config.idle_timeout, Duration::from_secs(5));
        assert_eq!(config.limits.max_streams, 256);
        assert_eq!(settings.shutdown_grace, Duration::from_secs(60));
        let receiver = settings.bind().unwrap();
        assert!(receiver.local_addr().unwrap().port() > 0);

        let err = toml::from_str::<ReceiverSettings>(&format!("{text}max_session = 3\n"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("unknown field `max_session`"), "{err}");
        for (change, says) in [
            ("idle_timeout = 0", "idle_timeout must be longer than zero"),
            ("max_streams = 0", "at least 1"),
            ("key = { text = \"short\" }", "at least"),
            ("key = { file = \"/nonexistent/key\" }", "/nonexistent/key"),
        ] {
            let field = change.split(' ').next().unwrap();
            let kept: String = text
                .lines()
                .filter(|l| !l.starts_with(field))
                .map(|l| format!("{l}\n"))
                .collect();
            let settings: ReceiverSettings = toml::from_str(&format!("{kept}{change}\n")).unwrap();
            let err = settings.bind().err().unwrap().to_string();
            assert!(err.contains(says), "{change}: {err}");
        }
    }
}
