//! wgtrain's live memory dashboard: [`recorder`] keeps what a run shows, [`server`]
//! serves it (axum) with the Leptos app that build.rs compiles from web/app, and
//! [`viz`] exports memory in PyTorch's memory_viz format. [`Dashboard::start`] runs the
//! server on its own threads, so training never waits on it.
//!
//! May call: `recorder`, `server`, `viz`, `connections`, `wgtrain_record`. Called by: the CLI, tests.

pub mod assets;
mod connections;
pub mod recorder;
pub mod server;
pub mod viz;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

pub use connections::{SEND_TIMEOUT, STALLED};
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
    /// An empty token would let anyone in.
    #[error("the dashboard's token is empty: give a non-empty --token, or none to have one generated")]
    EmptyToken,
}

/// How long a client may take to send its request headers before it is dropped.
pub const HEADER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// How long a new connection may stay silent before its first byte: one that sends
/// nothing is closed then.
pub const FIRST_BYTE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// Connections served at once (live streams included); beyond it the server stops
/// accepting until one ends, so file descriptors never run out.
pub const MAX_CONNECTIONS: usize = 256;

/// Connections one client address may hold at once on a dashboard that listens beyond
/// loopback (a browser opens six a host, and a stream a tab), so that one client cannot
/// take every connection; a loopback dashboard's clients all share one address, and
/// are not counted.
pub const MAX_PER_CLIENT: usize = 32;

/// How many connections each client address holds (a dashboard beyond loopback).
#[derive(Default)]
struct Clients(std::sync::Mutex<std::collections::HashMap<std::net::IpAddr, usize>>);

/// One connection of a client, counted until it is dropped.
struct ClientSlot(Arc<Clients>, std::net::IpAddr);

impl Clients {
    /// A slot for a connection from `ip`; none when it holds [`MAX_PER_CLIENT`].
    fn take(self: &Arc<Self>, ip: std::net::IpAddr) -> Option<ClientSlot> {
        let mut held = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let n = held.entry(ip).or_insert(0);
        (*n < MAX_PER_CLIENT).then(|| {
            *n += 1;
            ClientSlot(self.clone(), ip)
        })
    }
}

impl Drop for ClientSlot {
    fn drop(&mut self) {
        let mut held = self.0.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = held.get_mut(&self.1) {
            *n -= 1;
            if *n == 0 {
                held.remove(&self.1);
            }
        }
    }
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
    pub bench: Option<Vec<wgtrain_record::BenchRecord>>,
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
            Some(t) if t.trim().is_empty() => return Err(DashboardError::EmptyToken),
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
        // Without a token, a loopback dashboard answers only requests addressed to it by
        // a loopback name (any port: an SSH tunnel forwards another one): a page
        // elsewhere reaching it through DNS rebinding sends its own host name and is
        // refused.
        let allowed_hosts = (token.is_none() && server::is_loopback(&addr))
            .then(|| vec!["127.0.0.1".to_string(), "localhost".to_string(), "[::1]".to_string()]);
        let app = router(Served {
            live: options.live,
            runs_dir: options.runs_dir,
            token: token.clone(),
            bench: options.bench,
            allowed_hosts,
        });
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let clients = (!server::is_loopback(&addr)).then(Arc::<Clients>::default);
        runtime.spawn(serve(listener, app, clients, stopped));
        Ok(Dashboard {
            addr,
            token,
            runtime: Some(runtime),
            stop: Some(stop),
        })
    }

    /// The address to open, with the token (percent-encoded) when there is one.
    pub fn url(&self) -> String {
        let host = if self.addr.ip().is_unspecified() {
            "127.0.0.1".to_string()
        } else {
            self.addr.ip().to_string()
        };
        let host = if self.addr.is_ipv6() { format!("[{host}]") } else { host };
        match &self.token {
            Some(t) => format!(
                "http://{host}:{}/?{}",
                self.addr.port(),
                serde_urlencoded::to_string([("token", t)]).unwrap_or_default()
            ),
            None => format!("http://{host}:{}/", self.addr.port()),
        }
    }
}

/// Accepts connections until `stopped`: at most [`MAX_CONNECTIONS`] at once (and with
/// `clients`, [`MAX_PER_CLIENT`] of one address: more are closed at once), each closed
/// unless its first byte comes within [`FIRST_BYTE_TIMEOUT`], then served by hyper with
/// a deadline for its request headers ([`HEADER_TIMEOUT`]): idle and half-open
/// connections cannot pile up. When every slot is taken, or accepting fails because
/// the descriptors have run out, the connection idle longest is closed for the new one
/// ([`connections`]); a failing accept with none to close backs off up to a second,
/// warning once per back-off rather than once per try.
async fn serve(
    listener: tokio::net::TcpListener,
    app: axum::Router,
    clients: Option<Arc<Clients>>,
    mut stopped: tokio::sync::oneshot::Receiver<()>,
) {
    use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
    let permits = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    let open = Arc::new(connections::Connections::default());
    let mut backoff = std::time::Duration::ZERO;
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(c) => {
                    backoff = std::time::Duration::ZERO;
                    c
                }
                Err(e) => {
                    // Out of descriptors: an idle connection gives its own back at once.
                    let pause = if open.evict_oldest_idle() {
                        std::time::Duration::from_millis(10)
                    } else {
                        if backoff.is_zero() {
                            tracing::warn!("dashboard: accept failed: {e}; backing off");
                        }
                        backoff = (backoff * 2)
                            .clamp(std::time::Duration::from_millis(10), std::time::Duration::from_secs(1));
                        backoff
                    };
                    tokio::select! {
                        _ = tokio::time::sleep(pause) => {}
                        _ = &mut stopped => return,
                    }
                    continue;
                }
            },
            _ = &mut stopped => return,
        };
        let slot = match &clients {
            Some(c) => match c.take(peer.ip()) {
                Some(slot) => Some(slot),
                None => continue,
            },
            None => None,
        };
        let permit = loop {
            if let Ok(p) = permits.clone().try_acquire_owned() {
                break p;
            }
            // Every slot is taken: close the connection idle longest, or wait for one
            // to end (trying again as busy ones turn idle).
            open.evict_oldest_idle();
            tokio::select! {
                p = permits.clone().acquire_owned() => match p {
                    Ok(p) => break p,
                    Err(_) => return,
                },
                _ = tokio::time::sleep(std::time::Duration::from_millis(50)) => {}
                _ = &mut stopped => return,
            }
        };
        let registered = open.register();
        let app = hyper_util::service::TowerToHyperService::new(app.clone());
        tokio::spawn(async move {
            let _held = (permit, slot);
            let connection = registered.connection.clone();
            let served = async {
                let mut first = [0u8; 1];
                match tokio::time::timeout(FIRST_BYTE_TIMEOUT, stream.peek(&mut first)).await {
                    Ok(Ok(n)) if n > 0 => {}
                    _ => return,
                }
                // Each request keeps its connection busy until its response is sent.
                let service = hyper::service::service_fn(move |request| {
                    use hyper::service::Service;
                    let busy = connection.busy();
                    let response = app.call(request);
                    async move { response.await.map(|r| r.map(|body| connections::Guarded { body, _busy: busy })) }
                });
                let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                builder.http1().timer(TokioTimer::new()).header_read_timeout(HEADER_TIMEOUT);
                let _ = builder.serve_connection_with_upgrades(TokioIo::new(stream), service).await;
            };
            tokio::select! {
                _ = served => {}
                _ = registered.connection.evicted() => {}
            }
        });
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
