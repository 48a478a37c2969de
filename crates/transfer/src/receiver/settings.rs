//! A receiver's settings, as a program builds them or a service and `xfer recv --config` keep
//! them: where it listens, its root and key, its tenants, and how it serves
//! ([`ReceiverOptions`], the `[options]` table).

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{Access, ReceiverOptions, Tenant};
use crate::auth::KeySetting;

/// Everything a receiver needs; only `root` and `key` must be given, every other field has the
/// default `xfer recv` has. [`super::Receiver::bind`] checks them and binds.
///
/// ```
/// use std::time::Duration;
/// use transfer::receiver::ReceiverSettings;
///
/// let settings: ReceiverSettings = toml::from_str(r#"
///     listen = "0.0.0.0:9000"
///     root = "/data/incoming"
///     key = { file = "/etc/xfer/key" }
///     shutdown_grace = "10m"
///     [options]
///     transport = "mptcp"
///     max_sessions = 100
///     require_encryption = true
/// "#)?;
/// assert_eq!(settings.options.max_streams, 256, "left out: the default");
/// assert_eq!(settings.shutdown_grace, Duration::from_secs(600));
/// // Written back, e.g. to show the settings in effect.
/// assert!(toml::to_string(&settings)?.contains("max_sessions = 100"));
///
/// // A misspelt field is an error that names it, not a setting silently ignored.
/// let typo = toml::from_str::<ReceiverSettings>(
///     "root = \"/data\"\nkey = { file = \"/etc/xfer/key\" }\n[options]\nmax_session = 3",
/// );
/// assert!(typo.unwrap_err().to_string().contains("unknown field `max_session`"));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct ReceiverSettings {
    /// Address and port to listen on (one port serves control and all data streams).
    #[serde(default = "default_listen")]
    pub listen: String,
    /// Directory everything received with `key` is written under.
    pub root: PathBuf,
    /// The key senders must prove they hold.
    pub key: KeySetting,
    /// What holders of `key` may do under `root`: send files there (the default), fetch
    /// files from it, or both.
    #[serde(default)]
    pub access: Access,
    /// Keys of their own, each with its own root and limits (`[[tenants]]` tables), served
    /// beside `key` and `root` on the same port.
    #[serde(default)]
    pub tenants: Vec<Tenant>,
    /// How long the sessions running when the receiver is asked to stop may take to finish
    /// ([`super::Stopper::stop`]; zero ends them at once); `xfer recv` stops so on SIGTERM or
    /// SIGINT.
    #[serde(default = "default_shutdown_grace", with = "crate::duration")]
    pub shutdown_grace: Duration,
    /// How to serve.
    #[serde(default)]
    pub options: ReceiverOptions,
}

fn default_listen() -> String {
    "0.0.0.0:9000".into()
}

fn default_shutdown_grace() -> Duration {
    Duration::from_secs(60)
}

impl ReceiverSettings {
    /// Settings with every default, to serve `root` to senders that hold `key` (a
    /// [`KeySetting`], or a [`crate::auth::SessionKey`] already read).
    ///
    /// ```
    /// use transfer::auth::KeySetting;
    /// use transfer::receiver::ReceiverSettings;
    ///
    /// let mut settings = ReceiverSettings::new("/data/incoming".into(), KeySetting::File("/etc/xfer/key".into()))
    ///     .listen("10.0.0.1:9000");
    /// settings.options.max_sessions = 100;
    /// assert_eq!(settings.listen, "10.0.0.1:9000");
    /// ```
    pub fn new(root: PathBuf, key: impl Into<KeySetting>) -> Self {
        ReceiverSettings {
            listen: default_listen(),
            root,
            key: key.into(),
            access: Access::default(),
            tenants: Vec::new(),
            shutdown_grace: default_shutdown_grace(),
            options: ReceiverOptions::default(),
        }
    }

    /// Sets [`ReceiverSettings::listen`].
    pub fn listen(mut self, addr: impl Into<String>) -> Self {
        self.listen = addr.into();
        self
    }

    /// Sets [`ReceiverSettings::options`].
    pub fn options(mut self, options: ReceiverOptions) -> Self {
        self.options = options;
        self
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Receiver, ReceiverOptions};
    use super::*;

    #[test]
    fn settings_read_from_a_file_and_bad_values_are_named() {
        let root = tempfile::tempdir().unwrap();
        let text = format!(
            "listen = \"127.0.0.1:0\"\nroot = \"{}\"\nkey = {{ text = \"receiver-settings-test-key-0123\" }}\n",
            root.path().display()
        );
        let options = "[options]\nmax_sessions = 100\nidle_timeout = \"5s\"\n";
        let settings: ReceiverSettings = toml::from_str(&format!("{text}{options}")).unwrap();
        assert!(!format!("{settings:?}").contains("receiver-settings-test-key"));
        assert_eq!(
            settings.options,
            ReceiverOptions::default()
                .max_sessions(100)
                .idle_timeout(Duration::from_secs(5))
        );
        assert_eq!(settings.shutdown_grace, Duration::from_secs(60));
        let receiver = Receiver::bind(&settings).unwrap();
        assert!(receiver.local_addr().unwrap().port() > 0);

        for (change, says) in [
            (
                "[options]\nidle_timeout = 0",
                "idle_timeout must be longer than zero",
            ),
            ("[options]\nmax_streams = 0", "at least 1"),
            ("[options]\nmax_handshakes = 0", "at least 1"),
        ] {
            let settings: ReceiverSettings = toml::from_str(&format!("{text}{change}\n")).unwrap();
            let err = Receiver::bind(&settings).err().unwrap().to_string();
            assert!(err.contains(says), "{change}: {err}");
        }
        for (key, says) in [
            ("{ text = \"short\" }", "at least"),
            ("{ file = \"/nonexistent/key\" }", "/nonexistent/key"),
        ] {
            let kept: String = text
                .lines()
                .filter(|l| !l.starts_with("key"))
                .map(|l| format!("{l}\n"))
                .collect();
            let settings: ReceiverSettings =
                toml::from_str(&format!("{kept}key = {key}\n")).unwrap();
            let err = Receiver::bind(&settings).err().unwrap().to_string();
            assert!(err.contains(says), "{key}: {err}");
        }
    }
}
