//! Granary's node: a caching, S3-compatible data tier for deep-learning training.
//!
//! Layers, each importing only the ones below it:
//! - `api`: HTTP (S3 and native routes, routing to the key's owner, the one mapping of
//!   errors to S3 codes);
//! - `node`: the service every request path calls (reads, writes, batches, prefetch);
//! - `cache`, `cluster`, `transform`, `jobs`: the parts the node is made of;
//! - `backend`, `io`: object stores and disk reads.
//!
//! `granary_proto` (SigV4, S3 XML, encodings) is shared by all of them and by the client,
//! the bench and the tests. `run` wires a `Config` into a serving node.

pub mod api;
pub mod archive;
pub mod backend;
pub mod cache;
pub mod cluster;
pub mod config;
#[doc(hidden)]
pub mod fuzzing;
pub mod io;
pub mod jobs;
pub mod keylock;
pub mod limits;
pub mod local;
pub mod node;
pub mod stats;
pub mod tls;
pub mod transform;

use std::sync::Arc;

use anyhow::Context;

use backend::fs::FsBackend;
use backend::Backend;
use config::{BackendSpec, Config};

/// Opens the configured backend, its reads capped at `--max-backend-fetches`.
pub async fn open_backend(config: &Config) -> anyhow::Result<Arc<dyn Backend>> {
    let backend = open_store(config).await?;
    Ok(backend::limit::Limited::wrap(
        backend,
        config.max_backend_fetches,
    ))
}

async fn open_store(config: &Config) -> anyhow::Result<Arc<dyn Backend>> {
    match config.backend_spec()? {
        BackendSpec::Fs(dir) => {
            let fs = FsBackend::open(&dir)
                .with_context(|| format!("cannot open the fs backend at {}", dir.display()))?;
            Ok(Arc::new(fs))
        }
        BackendSpec::S3 => {
            let s3 = backend::s3::S3Backend::connect(config.s3_endpoint.as_deref())
                .await
                .context("cannot set up the s3 backend")?;
            Ok(Arc::new(s3))
        }
    }
}

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
    std::fs::create_dir_all(&config.data_dir)
        .with_context(|| format!("cannot create the data dir {}", config.data_dir.display()))?;
    let backend = open_backend(&config).await?;
    let stats = Arc::new(stats::Stats::default());
    let cache_dir = config.data_dir.join("cache");
    std::fs::create_dir_all(&cache_dir)
        .with_context(|| format!("cannot create the cache dir {}", cache_dir.display()))?;
    let capacity = match config.cache_capacity {
        Some(c) => c,
        None => {
            let free = fs4::available_space(&cache_dir).with_context(|| {
                format!("cannot read the free space of {}", cache_dir.display())
            })?;
            free / 10 * 9
        }
    };
    let engine = io::engine(config.read_engine).context("cannot start the cache read engine")?;
    tracing::info!(engine = engine.name(), "cache read engine");
    if config.sendfile {
        io::sendfile::enable();
        tracing::info!("large cache hits leave with sendfile");
    }
    let cache = cache::Cache::open(
        &cache_dir,
        capacity,
        config.cache_policy,
        config.verify_reads,
        engine,
        stats.clone(),
    )
    .with_context(|| format!("cannot open the cache at {}", cache_dir.display()))?
    .with_direct_fills(config.direct_fills);
    let cluster = Arc::new(cluster::Cluster::new(
        &config,
        &config.node_id(),
        capacity,
        stats.clone(),
    )?);
    if !cluster.is_single() {
        tracing::info!(
            members = cluster.members().len(),
            route = ?config.route,
            "cluster member"
        );
    }
    // Listening before the first probe: a member that this node's probe announces it to
    // probes it back before answering, and must reach it (its connection waits in the
    // backlog until serving starts); refused, it would answer that it lists this node
    // while not seeing it up, and this node would settle before the member sees it.
    let listen = config.listen;
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("cannot listen on {listen}"))?;
    cluster::membership::spawn(cluster.clone(), cluster::source::Watch::of(&config)?);
    let transforms = transform::Transforms::new(&config.transforms);
    let node = node::Node::new(
        backend,
        Arc::new(cache),
        cluster,
        stats,
        transforms,
        config.rebalance_rate,
    );
    node.start();
    let unix = config.listen_unix.clone();
    let idle = config.idle_timeout;
    let state = api::AppState::new(&config, node);
    let app = api::router(state.clone());

    tracing::info!(
        addr = %listener.local_addr()?,
        node_id = %state.node.id,
        backend = %state.node.backend.describe(),
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
    axum::serve(listener, app)
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
