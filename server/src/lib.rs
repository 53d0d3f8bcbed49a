//! Granary's node daemon: the HTTP surface over the node service of `granary_core`.
//!
//! Layers, each importing only the ones below it:
//! - `api` (this crate): HTTP (S3 and native routes, routing to the key's owner, the
//!   table of members' calls, the one mapping of errors to S3 codes), with `tls`,
//!   `local` (the Unix socket) and `limits`;
//! - [`granary_core::Node`]: the service every request path calls, the one front of the
//!   cache, the cluster, the transforms, the jobs, the backends and disk I/O below it
//!   (a crate of their own, so the compiler holds the rule).
//!
//! `granary_proto` (SigV4, S3 XML, encodings, peer authentication) is shared by all of
//! them and by the client, the bench and the tests. `run` opens a node from a `Config`
//! and serves it.

pub mod api;
pub mod config;
#[doc(hidden)]
pub mod fuzzing;
pub mod limits;
pub mod local;
pub mod tls;

use anyhow::Context;

use config::Config;

/// Serves until SIGINT or SIGTERM.
pub async fn run(config: Config) -> anyhow::Result<()> {
    config.validate()?;
    match limits::raise_open_files() {
        Ok((before, after)) => tracing::info!(before, after, "open-file limit"),
        Err(e) => tracing::warn!(error = %e, "open-file limit left as it was"),
    }
    let tls = match (&config.tls_cert, &config.tls_key) {
        (Some(cert), Some(key)) => Some(tls::acceptor(cert, key)?),
        _ => None,
    };
    let node = granary_core::Node::open(config.node_config()?).await?;
    // Listening before the first probe: a member that this node's probe announces it to
    // probes it back before answering, and must reach it (its connection waits in the
    // backlog until serving starts); refused, it would answer that it lists this node
    // while not seeing it up, and this node would settle before the member sees it.
    let listen = config.listen;
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("cannot listen on {listen}"))?;
    node.start();
    let unix = config.listen_unix.clone();
    let idle = config.idle_timeout;
    let state = api::AppState::new(&config, node);
    let app = api::router(state.clone());

    tracing::info!(
        addr = %listener.local_addr()?,
        node_id = %state.node.id(),
        backend = %state.node.backend_name(),
        auth = state.creds.is_some(),
        tls = tls.is_some(),
        "granary serving"
    );
    if let Some(path) = unix {
        let ul = local::FdListener::bind(&path)
            .with_context(|| format!("cannot listen on {}", path.display()))?;
        let ul = limits::Timed::new(ul, idle);
        tracing::info!(path = %path.display(), "also serving on a Unix socket");
        let app = app
            .clone()
            .into_make_service_with_connect_info::<local::FdSender>();
        tokio::spawn(async move {
            if let Err(e) = axum::serve(ul, app)
                .with_graceful_shutdown(shutdown())
                .await
            {
                tracing::error!(error = %e, "unix socket server failed");
            }
        });
    }
    if let Some(acceptor) = tls {
        let listener = limits::Timed::new(tls::TlsListener::new(listener, acceptor), idle);
        axum::serve(listener, app)
            .with_graceful_shutdown(shutdown())
            .await?;
        tracing::info!("granary stopped");
        return Ok(());
    }
    // Headers and body leave in separate writes: without TCP_NODELAY a small body waits
    // on the client's delayed ACK of the headers (tens of ms on a keep-alive connection).
    let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "TCP_NODELAY not set");
        }
    });
    let listener = limits::Timed::new(listener, idle);
    // Clients on this machine are told of the Unix socket, to go on over it.
    let app = match &config.listen_unix {
        Some(path) => local::advertise(app, path)?,
        None => app,
    };
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<local::TcpPeer>(),
    )
    .with_graceful_shutdown(shutdown())
    .await?;
    tracing::info!("granary stopped");
    Ok(())
}

async fn shutdown() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term => {}
    }
}
