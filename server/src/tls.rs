//! HTTPS (`--tls-cert F --tls-key F`): rustls over the TCP listener. The handshake runs
//! in the connection's own task (the first read or write of the stream drives it), so a
//! client that never finishes its handshake holds up nobody but itself, and the accept
//! loop stays the one axum runs for plain TCP.

use granary_core::sendfile;
use std::io;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use anyhow::Context as _;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::server::TlsStream;
use tokio_rustls::{Accept, TlsAcceptor};

/// How long a client may take over its handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The server side of TLS from a PEM certificate chain and a PEM private key (PKCS#8,
/// PKCS#1 or SEC1).
pub fn acceptor(cert: &Path, key: &Path) -> anyhow::Result<TlsAcceptor> {
    let chain = CertificateDer::pem_file_iter(cert)
        .with_context(|| format!("cannot read the certificate {}", cert.display()))?
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("bad PEM in {}", cert.display()))?;
    anyhow::ensure!(!chain.is_empty(), "{} holds no certificate", cert.display());
    let key = PrivateKeyDer::from_pem_file(key)
        .with_context(|| format!("cannot read a private key from {}", key.display()))?;
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .context("the certificate and key do not make a TLS identity")?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// A TCP listener whose connections speak TLS.
pub struct TlsListener {
    tcp: TcpListener,
    acceptor: TlsAcceptor,
}

impl TlsListener {
    pub fn new(tcp: TcpListener, acceptor: TlsAcceptor) -> TlsListener {
        TlsListener { tcp, acceptor }
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsConn;
    type Addr = std::net::SocketAddr;

    async fn accept(&mut self) -> (TlsConn, Self::Addr) {
        loop {
            match self.tcp.accept().await {
                Ok((tcp, addr)) => {
                    if let Err(e) = tcp.set_nodelay(true) {
                        tracing::debug!(error = %e, "TCP_NODELAY not set");
                    }
                    let handshake = self.acceptor.accept(tcp);
                    let deadline = Box::pin(tokio::time::sleep(HANDSHAKE_TIMEOUT));
                    return (TlsConn::Handshake(Box::new(handshake), deadline), addr);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.tcp.local_addr()
    }
}

/// A TLS connection: handshaking until its first use completes the handshake.
pub enum TlsConn {
    Handshake(Box<Accept<TcpStream>>, Pin<Box<tokio::time::Sleep>>),
    Ready(Box<TlsStream<TcpStream>>),
    Failed,
}

impl TlsConn {
    /// Drives the handshake; ready once the stream is.
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<&mut TlsStream<TcpStream>>> {
        if let TlsConn::Handshake(accept, deadline) = self {
            let done = match Pin::new(accept.as_mut()).poll(cx) {
                Poll::Ready(r) => r,
                Poll::Pending => {
                    ready!(deadline.as_mut().poll(cx));
                    Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "TLS handshake took too long",
                    ))
                }
            };
            match done {
                Ok(stream) => *self = TlsConn::Ready(Box::new(stream)),
                Err(e) => {
                    tracing::debug!(error = %e, "TLS handshake failed");
                    *self = TlsConn::Failed;
                    return Poll::Ready(Err(e));
                }
            }
        }
        match self {
            TlsConn::Ready(s) => Poll::Ready(Ok(s)),
            _ => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::NotConnected,
                "the TLS handshake failed",
            ))),
        }
    }
}

use std::future::Future;

impl AsyncRead for TlsConn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let s = ready!(self.get_mut().poll_ready(cx))?;
        Pin::new(s).poll_read(cx, buf)
    }
}

/// Encrypted bytes cannot leave by `sendfile`: mapped bodies are read and encrypted.
impl sendfile::FileSink for TlsConn {}

impl AsyncWrite for TlsConn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let s = ready!(self.get_mut().poll_ready(cx))?;
        Pin::new(s).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let s = ready!(self.get_mut().poll_ready(cx))?;
        Pin::new(s).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let s = ready!(self.get_mut().poll_ready(cx))?;
        Pin::new(s).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            TlsConn::Ready(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
            _ => Poll::Ready(Ok(())),
        }
    }
}
