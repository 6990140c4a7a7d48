//! wgtrain's live memory dashboard: [`recorder`] keeps what a run shows, [`server`]
//! serves it (axum) with the Leptos app that build.rs compiles from web/app, and
//! [`viz`] exports memory in PyTorch's memory_viz format. [`Dashboard::start`] runs the
//! server on its own threads, so training never waits on it.
//!
//! May call: `recorder`, `server`, `viz`, `wgtrain_protocol`. Called by: the CLI, tests.

pub mod assets;
pub mod recorder;
pub mod server;
pub mod viz;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

pub use recorder::Recorder;
pub use server::{Served, router};

/// Why the dashboard could not start.
#[derive(Debug, thiserror::Error)]
pub enum DashboardError {
    /// The address is taken or not ours.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The cause.
        source: std::io::Error,
    },
    /// The async runtime could not start.
    #[error("cannot start the dashboard's runtime: {0}")]
    Runtime(std::io::Error),
}

/// A running dashboard; stops when dropped.
pub struct Dashboard {
    /// Where it listens.
    pub addr: SocketAddr,
    /// The token every request must carry (non-loopback addresses).
    pub token: Option<String>,
    runtime: Option<tokio::runtime::Runtime>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

/// What to serve and where (default: nothing, on 127.0.0.1:8787).
pub struct Options {
    /// The address to listen on (port 0 picks a free one).
    pub addr: SocketAddr,
    /// A token; generated when the address is not loopback and none is given.
    pub token: Option<String>,
    /// The live run.
    pub live: Option<Arc<Recorder>>,
    /// A folder of finished runs.
    pub runs_dir: Option<PathBuf>,
    /// Kernel timings to show.
    pub bench: Option<Vec<wgtrain_protocol::BenchRecord>>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            addr: std::net::SocketAddr::from(([127, 0, 0, 1], 8787)),
            token: None,
            live: None,
            runs_dir: None,
            bench: None,
        }
    }
}

fn generate_token() -> String {
    let bytes: [u8; 16] = rand::random();
    hex::encode(bytes)
}

impl Dashboard {
    /// Binds and serves on two background threads.
    pub fn start(options: Options) -> Result<Dashboard, DashboardError> {
        let token = match options.token {
            Some(t) => Some(t),
            None if !server::is_loopback(&options.addr) => Some(generate_token()),
            None => None,
        };
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("wgtrain-dashboard")
            .enable_all()
            .build()
            .map_err(DashboardError::Runtime)?;
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind(options.addr))
            .map_err(|e| DashboardError::Bind {
                addr: options.addr,
                source: e,
            })?;
        let addr = listener.local_addr().map_err(|e| DashboardError::Bind {
            addr: options.addr,
            source: e,
        })?;
        let app = router(Served {
            live: options.live,
            runs_dir: options.runs_dir,
            token: token.clone(),
            bench: options.bench,
        });
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        runtime.spawn(async move {
            let serve = axum::serve(listener, app).with_graceful_shutdown(async {
                let _ = stopped.await;
            });
            if let Err(e) = serve.await {
                tracing::error!("dashboard server stopped: {e}");
            }
        });
        Ok(Dashboard {
            addr,
            token,
            runtime: Some(runtime),
            stop: Some(stop),
        })
    }

    /// The address to open, with the token when there is one.
    pub fn url(&self) -> String {
        let host = if self.addr.ip().is_unspecified() {
            "127.0.0.1".to_string()
        } else {
            self.addr.ip().to_string()
        };
        let host = if self.addr.is_ipv6() { format!("[{host}]") } else { host };
        match &self.token {
            Some(t) => format!("http://{host}:{}/?token={t}", self.addr.port()),
            None => format!("http://{host}:{}/", self.addr.port()),
        }
    }
}

impl Drop for Dashboard {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(rt) = self.runtime.take() {
            // Open streams would keep a graceful shutdown waiting: give them a moment.
            rt.shutdown_timeout(std::time::Duration::from_millis(500));
        }
    }
}
