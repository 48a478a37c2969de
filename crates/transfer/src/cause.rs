//! The error behind another: [`Cause`], which an error of this crate returns from
//! [`std::error::Error::source`].

use std::error::Error;
use std::fmt;
use std::sync::Arc;

/// Why something failed: the underlying error as it was (its own sources kept), shared, so
/// that the error carrying it stays `Clone` (a [`crate::job::SendEvent`] is cloned to its
/// reader). Two causes are equal when their texts are.
///
/// The crate's errors follow one convention: an error's text says what failed and names what
/// it concerns (the file, the receiver, the limit); why it failed is its `source()`, not
/// repeated in the text. Print the whole chain to show both, as `xfer` does (anyhow's `{:#}`),
/// or walk `source()`:
///
/// ```
/// use std::error::Error;
/// use transfer::sender::SendError;
/// use transfer::Cause;
///
/// /// The error and every cause behind it, on one line.
/// fn explain(e: &dyn Error) -> String {
///     let mut text = e.to_string();
///     let mut cause = e.source();
///     while let Some(c) = cause {
///         text += &format!(": {c}");
///         cause = c.source();
///     }
///     text
/// }
///
/// let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
/// let e = SendError::Connect { addr: "dtn.example.org:9000".into(), cause: refused.into() };
/// assert_eq!(e.to_string(), "cannot connect to dtn.example.org:9000");
/// assert_eq!(explain(&e), "cannot connect to dtn.example.org:9000: connection refused");
///
/// // The underlying error, to act on its kind.
/// let SendError::Connect { cause, .. } = &e else { unreachable!() };
/// let io = cause.get().downcast_ref::<std::io::Error>().unwrap();
/// assert_eq!(io.kind(), std::io::ErrorKind::ConnectionRefused);
/// ```
#[derive(Clone)]
pub struct Cause(Arc<dyn Error + Send + Sync>);

impl Cause {
    /// The cause `error`.
    pub fn new(error: impl Error + Send + Sync + 'static) -> Cause {
        Cause(Arc::new(error))
    }

    /// A cause known only by its text (a peer's words, a condition with no error value).
    pub(crate) fn msg(text: impl Into<String>) -> Cause {
        Cause(Arc::new(Message(text.into())))
    }

    /// The underlying error, to inspect or downcast.
    pub fn get(&self) -> &(dyn Error + Send + Sync + 'static) {
        &*self.0
    }
}

impl From<std::io::Error> for Cause {
    fn from(error: std::io::Error) -> Cause {
        Cause::new(error)
    }
}

impl From<&str> for Cause {
    fn from(text: &str) -> Cause {
        Cause::msg(text)
    }
}

impl From<String> for Cause {
    fn from(text: String) -> Cause {
        Cause::msg(text)
    }
}

impl From<crate::wire::WireError> for Cause {
    fn from(error: crate::wire::WireError) -> Cause {
        Cause::new(error)
    }
}

impl Error for Cause {
    /// The underlying error's own source: the cause stands in for the error it holds.
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        self.0.source()
    }
}

impl fmt::Debug for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl fmt::Display for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl PartialEq for Cause {
    fn eq(&self, other: &Cause) -> bool {
        self.to_string() == other.to_string()
    }
}

impl Eq for Cause {}

/// A cause that is only text.
#[derive(Debug)]
struct Message(String);

impl fmt::Display for Message {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl Error for Message {}
