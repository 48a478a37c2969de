//! A connection's two halves, plain TCP, TLS ([`crate::tls`]) or a QUIC stream
//! ([`crate::quic`]): the reader and writer that the protocol code uses from its two threads,
//! and the [`Connection`] kept for statistics, timeouts and shutdown.

use std::io::{self, IoSlice, Read, Write};
use std::net::{Shutdown, TcpStream};

use crate::auth::ChannelBinding;
use crate::quic::{QuicConnection, QuicWriter};
use crate::tls::{self, ServerIdentity, TlsReader, TlsWriter};

/// What carries a connection: a TCP (or MPTCP) socket or a QUIC connection.
#[derive(Debug)]
pub enum Connection {
    /// A TCP or MPTCP socket.
    Tcp(TcpStream),
    /// A QUIC connection.
    Quic(QuicConnection),
}

impl Connection {
    /// Another handle to the same connection.
    pub fn try_clone(&self) -> io::Result<Connection> {
        Ok(match self {
            Connection::Tcp(s) => Connection::Tcp(s.try_clone()?),
            Connection::Quic(q) => Connection::Quic(q.clone()),
        })
    }

    /// Closes both directions at once: blocked reads and writes on either half fail.
    pub fn shutdown(&self) {
        match self {
            Connection::Tcp(s) => {
                let _ = s.shutdown(Shutdown::Both);
            }
            Connection::Quic(q) => q.close(),
        }
    }
}

/// The reading half: plaintext from `R` (the socket, or a reader of it with timeouts).
pub enum LinkReader<R> {
    /// Bytes as they arrive.
    Plain(R),
    /// Decrypted from the TLS records `R` delivers.
    Tls(TlsReader<R>),
}

impl<R> LinkReader<R> {
    /// What the bytes come from.
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
pub enum LinkWriter {
    /// Straight to the socket.
    Plain(TcpStream),
    /// Encrypted into TLS records.
    Tls(TlsWriter),
    /// Onto a QUIC stream (encrypted by QUIC).
    Quic(QuicWriter),
}

impl Write for LinkWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            LinkWriter::Plain(s) => s.write(buf),
            LinkWriter::Tls(t) => t.write(buf),
            LinkWriter::Quic(q) => q.write(buf),
        }
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        match self {
            LinkWriter::Plain(s) => s.write_vectored(bufs),
            LinkWriter::Tls(t) => t.write_vectored(bufs),
            LinkWriter::Quic(q) => q.write_vectored(bufs),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            LinkWriter::Plain(s) => s.flush(),
            LinkWriter::Tls(t) => t.flush(),
            LinkWriter::Quic(q) => q.flush(),
        }
    }
}

/// Both halves of a connection, and the channel binding its key handshake must prove.
pub type Halves<R> = (LinkReader<R>, LinkWriter, ChannelBinding);

/// The sender's side of a new connection: TLS when `encrypt`.
pub fn client(socket: &TcpStream, encrypt: bool) -> io::Result<Halves<TcpStream>> {
    if encrypt {
        let (reader, writer, binding) = tls::connect(socket, socket.try_clone()?)?;
        Ok((LinkReader::Tls(reader), LinkWriter::Tls(writer), binding))
    } else {
        Ok((
            LinkReader::Plain(socket.try_clone()?),
            LinkWriter::Plain(socket.try_clone()?),
            ChannelBinding::PLAIN,
        ))
    }
}

/// The receiver's side of an accepted connection, reading through `source`: TLS when the
/// client opens with a TLS handshake. Also says which it was.
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
