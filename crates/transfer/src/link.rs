//! A TCP connection's two halves, plain or TLS ([`crate::tls`]): the reader and writer that
//! the protocol code uses from its threads; and the `Connection` kept for statistics and
//! shutdown, TCP's or a QUIC connection's ([`crate::quic`]).

use std::io::{self, IoSlice, Read, Write};
use std::net::{Shutdown, TcpStream};

use rustix::event::{PollFd, PollFlags, Timespec};

use crate::auth::ChannelBinding;
use crate::quic::QuicConnection;
use crate::tls::{self, ServerIdentity, TlsReader, TlsWriter};

/// What carries a connection: a TCP (or MPTCP) socket or a QUIC connection; a handle kept for
/// statistics and shutdown (a watchdog's, a session's list of its streams).
#[derive(Debug)]
pub(crate) enum Connection {
    /// A TCP or MPTCP socket.
    Tcp(TcpStream),
    /// A QUIC connection.
    Quic(QuicConnection),
}

impl Connection {
    /// Another handle to the same connection.
    pub(crate) fn try_clone(&self) -> io::Result<Connection> {
        Ok(match self {
            Connection::Tcp(s) => Connection::Tcp(s.try_clone()?),
            Connection::Quic(q) => Connection::Quic(q.clone()),
        })
    }

    /// Closes both directions at once: blocked reads and writes on either half fail.
    pub(crate) fn shutdown(&self) {
        match self {
            Connection::Tcp(s) => {
                let _ = s.shutdown(Shutdown::Both);
            }
            Connection::Quic(q) => q.close(),
        }
    }
}

/// The reading half: plaintext from `R` (the socket, or a reader of it with timeouts).
///
/// ```
/// # use std::io::{Read, Write};
/// # use std::net::{TcpListener, TcpStream};
/// # use transfer::tls::ServerIdentity;
/// # let listener = TcpListener::bind("127.0.0.1:0").unwrap();
/// # let addr = listener.local_addr().unwrap();
/// # let identity = ServerIdentity::generate().unwrap();
/// # let receiver = std::thread::spawn(move || {
/// #     let (socket, _) = listener.accept().unwrap();
/// #     let ((mut reader, mut writer, binding), encrypted) = transfer::link::server(&socket, socket.try_clone().unwrap(), &identity).unwrap();
/// #     let mut hello = [0; 5];
/// #     reader.read_exact(&mut hello).unwrap();
/// #     writer.write_all(&hello).unwrap();
/// #     writer.flush().unwrap();
/// #     (encrypted, binding)
/// # });
/// # let socket = TcpStream::connect(addr).unwrap();
/// let (mut reader, mut writer, _) = transfer::link::client(&socket, true).unwrap();
/// writer.write_all(b"hello").unwrap();
/// let mut echo = [0; 5];
/// reader.read_exact(&mut echo).unwrap();
/// assert_eq!(&echo, b"hello");
/// assert!(matches!(reader, transfer::link::LinkReader::Tls(_)));
/// # receiver.join().unwrap();
/// ```
pub enum LinkReader<R> {
    /// Bytes as they arrive.
    Plain(R),
    /// Decrypted from the TLS records `R` delivers.
    Tls(TlsReader<R>),
}

impl<R> LinkReader<R> {
    /// What the bytes come from.
    ///
    /// ```
    /// use std::net::{TcpListener, TcpStream};
    ///
    /// let listener = TcpListener::bind("127.0.0.1:0")?;
    /// let socket = TcpStream::connect(listener.local_addr()?)?;
    /// let (mut reader, _, _) = transfer::link::client(&socket, false)?;
    /// reader.source_mut().0.set_read_timeout(Some(std::time::Duration::from_secs(5)))?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn source_mut(&mut self) -> &mut R {
        match self {
            LinkReader::Plain(r) => r,
            LinkReader::Tls(t) => t.source_mut(),
        }
    }
}

impl<R: Read> Read for LinkReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            LinkReader::Plain(r) => r.read(buf),
            LinkReader::Tls(t) => t.read(buf),
        }
    }
}

/// The writing half.
///
/// ```
/// use std::io::Write;
/// use std::net::{TcpListener, TcpStream};
///
/// let listener = TcpListener::bind("127.0.0.1:0")?;
/// let socket = TcpStream::connect(listener.local_addr()?)?;
/// let (_, mut writer, _) = transfer::link::client(&socket, false)?;
/// transfer::wire::write_message(&mut writer, &transfer::wire::Message::Finish).unwrap();
/// writer.flush()?;
/// # Ok::<(), std::io::Error>(())
/// ```
pub enum LinkWriter {
    /// Straight to the socket.
    Plain(TcpStream),
    /// Encrypted into TLS records.
    Tls(TlsWriter),
}

impl Write for LinkWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            LinkWriter::Plain(s) => s.write(buf),
            LinkWriter::Tls(t) => t.write(buf),
        }
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        match self {
            LinkWriter::Plain(s) => s.write_vectored(bufs),
            LinkWriter::Tls(t) => t.write_vectored(bufs),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            LinkWriter::Plain(s) => s.flush(),
            LinkWriter::Tls(t) => t.flush(),
        }
    }
}

/// Both halves of a connection, and the channel binding its key handshake must prove.
///
/// ```
/// use std::net::{TcpListener, TcpStream};
/// use transfer::auth::ChannelBinding;
/// use transfer::link::{Halves, PollRead};
///
/// let listener = TcpListener::bind("127.0.0.1:0")?;
/// let socket = TcpStream::connect(listener.local_addr()?)?;
/// let (_, _, binding): Halves<PollRead> = transfer::link::client(&socket, false)?;
/// assert_eq!(binding, ChannelBinding::PLAIN);
/// # Ok::<(), std::io::Error>(())
/// ```
pub type Halves<R> = (LinkReader<R>, LinkWriter, ChannelBinding);

/// A TCP socket that is read only once `poll` finds input on it, within the socket's read
/// timeout (a timeout reads as [`io::ErrorKind::WouldBlock`], as a timed-out `read` does).
///
/// The sender reads and writes each socket from two threads. A thread blocked in `read` is
/// woken by every event on its socket, each "room to write" included, and goes back to sleep
/// with nothing read; waiting in `poll` for input it is woken by input alone. Per 512 MiB over
/// one stream at 600 Mbit/s that spared 4,000 wake-ups of the reader, as many as the writer's
/// (docs/experiments/2026-11-29-cpu-per-gbit-against-iperf3.md).
///
/// ```
/// use std::io::{ErrorKind, Read};
/// use std::net::{TcpListener, TcpStream};
/// use std::time::Duration;
/// use transfer::link::PollRead;
///
/// let listener = TcpListener::bind("127.0.0.1:0")?;
/// let socket = TcpStream::connect(listener.local_addr()?)?;
/// socket.set_read_timeout(Some(Duration::from_millis(20)))?;
/// let err = PollRead(socket).read(&mut [0; 4]).unwrap_err();
/// assert_eq!(err.kind(), ErrorKind::WouldBlock);
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Debug)]
pub struct PollRead(pub TcpStream);

impl Read for PollRead {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let timeout = match self.0.read_timeout()? {
            Some(t) => Some(Timespec::try_from(t).map_err(io::Error::other)?),
            None => None,
        };
        loop {
            let mut fds = [PollFd::new(&self.0, PollFlags::IN)];
            match rustix::event::poll(&mut fds, timeout.as_ref()) {
                Ok(0) => return Err(io::ErrorKind::WouldBlock.into()),
                Ok(_) => return self.0.read(buf),
                // A signal ended the wait early: wait again (the timeout restarts, as it
                // would for a `read` that was retried).
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return Err(e.into()),
            }
        }
    }
}

/// The sender's side of a new connection: TLS when `encrypt`; either way read through
/// [`PollRead`].
///
/// ```
/// # use std::io::{Read, Write};
/// # use std::net::{TcpListener, TcpStream};
/// # use transfer::tls::ServerIdentity;
/// # let listener = TcpListener::bind("127.0.0.1:0").unwrap();
/// # let addr = listener.local_addr().unwrap();
/// # let identity = ServerIdentity::generate().unwrap();
/// # let receiver = std::thread::spawn(move || {
/// #     let (socket, _) = listener.accept().unwrap();
/// #     let ((mut reader, mut writer, binding), encrypted) = transfer::link::server(&socket, socket.try_clone().unwrap(), &identity).unwrap();
/// #     let mut hello = [0; 5];
/// #     reader.read_exact(&mut hello).unwrap();
/// #     writer.write_all(&hello).unwrap();
/// #     writer.flush().unwrap();
/// #     (encrypted, binding)
/// # });
/// # let socket = TcpStream::connect(addr).unwrap();
/// let (mut reader, mut writer, binding) = transfer::link::client(&socket, true).unwrap();
/// writer.write_all(b"hello").unwrap();
/// reader.read_exact(&mut [0; 5]).unwrap();
/// let (encrypted, receivers_binding) = receiver.join().unwrap();
/// assert!(encrypted);
/// assert_eq!(binding, receivers_binding, "both ends bind their proofs to this TLS session");
/// ```
pub fn client(socket: &TcpStream, encrypt: bool) -> io::Result<Halves<PollRead>> {
    let source = PollRead(socket.try_clone()?);
    if encrypt {
        let (reader, writer, binding) = tls::connect(socket, source)?;
        Ok((LinkReader::Tls(reader), LinkWriter::Tls(writer), binding))
    } else {
        Ok((
            LinkReader::Plain(source),
            LinkWriter::Plain(socket.try_clone()?),
            ChannelBinding::PLAIN,
        ))
    }
}

/// The receiver's side of an accepted connection, reading through `source`: TLS when the
/// client opens with a TLS handshake. Also says which it was.
///
/// ```
/// # use std::io::{Read, Write};
/// # use std::net::{TcpListener, TcpStream};
/// # use transfer::tls::ServerIdentity;
/// # let listener = TcpListener::bind("127.0.0.1:0").unwrap();
/// # let addr = listener.local_addr().unwrap();
/// # let identity = ServerIdentity::generate().unwrap();
/// # let receiver = std::thread::spawn(move || {
/// #     let (socket, _) = listener.accept().unwrap();
/// #     let ((mut reader, mut writer, binding), encrypted) = transfer::link::server(&socket, socket.try_clone().unwrap(), &identity).unwrap();
/// #     let mut hello = [0; 5];
/// #     reader.read_exact(&mut hello).unwrap();
/// #     writer.write_all(&hello).unwrap();
/// #     writer.flush().unwrap();
/// #     (encrypted, binding)
/// # });
/// # let socket = TcpStream::connect(addr).unwrap();
/// let (mut reader, mut writer, _) = transfer::link::client(&socket, false).unwrap();
/// writer.write_all(b"plain").unwrap();
/// reader.read_exact(&mut [0; 5]).unwrap();
/// assert!(!receiver.join().unwrap().0, "one port serves plain and TLS clients");
/// ```
pub fn server<R: Read>(
    socket: &TcpStream,
    source: R,
    identity: &ServerIdentity,
) -> io::Result<(Halves<R>, bool)> {
    if tls::peer_starts_tls(socket)? {
        let (reader, writer, binding) = tls::accept(identity, socket, source)?;
        Ok((
            (LinkReader::Tls(reader), LinkWriter::Tls(writer), binding),
            true,
        ))
    } else {
        let halves = (
            LinkReader::Plain(source),
            LinkWriter::Plain(socket.try_clone()?),
            ChannelBinding::PLAIN,
        );
        Ok((halves, false))
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read;
    use std::net::{TcpListener, TcpStream};

    use super::Connection;

    /// A handle kept elsewhere (a watchdog's) shuts the connection down for every half: a read
    /// that would wait ends at once.
    #[test]
    fn a_cloned_handle_shuts_the_connection_down() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut socket = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let _peer = listener.accept().unwrap();
        let connection = Connection::Tcp(socket.try_clone().unwrap());
        let handle = connection.try_clone().unwrap();
        assert!(matches!(handle, Connection::Tcp(_)));
        handle.shutdown();
        assert_eq!(socket.read(&mut [0; 8]).unwrap(), 0);
    }
}
