//! The tokio side: accepting connections, serving HTTP/1.1 on each with hyper, and choosing per request
//! between the fast path (read the body here, queue it for Python, wait for Python's answer) and the reverse
//! proxy to the Python app (`proxy.rs`).
//!
//! hyper parses the heads and frames the bodies; what it does not do is kept here, per connection:
//! * the head timeout: a connection counts as "waiting for its head" from its accept, and again from the
//!   moment its last response was written (idle keep-alive), until hyper hands us the next request. If that
//!   lasts `header_timeout`, the connection is closed. (hyper's own header_read_timeout only starts at the
//!   first byte of a head, so a silent or idle connection would stay forever.)
//! * the connection cap: beyond `max_connections`, the oldest connection still waiting for its head is
//!   closed to make room; connections in the middle of a request are never evicted (when every one is
//!   busy, the newcomer is served anyway: refusing it would punish the one client that is not idle).
//! * graceful close: on `close()`, idle connections are closed and busy ones end after their response.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, RwLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::header::{self, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Notify, Semaphore};

use crate::frames::Specs;
use crate::queue::{Queue, Refused, Upload};

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
pub type AnyBody = UnsyncBoxBody<Bytes, BoxError>;

/// What the Python constructor fixed.
pub struct Config {
    pub upstream: Option<String>,
    pub upload_path: String,
    pub content_types: Vec<String>, // lower case
    pub max_body_bytes: u64,
    pub body_timeout: Duration,
    pub header_timeout: Duration,
    /// The most a proxied request waits for the app's answer to begin (its head); then 504 `upstream_timeout`.
    pub upstream_timeout: Duration,
    pub max_connections: usize,
    /// Bytes of upload bodies being read, in all: an upload whose next chunk finds none left is refused 503
    /// `overloaded` and its connection closed. Counted as bytes arrive, so a slow body holds only what it sent.
    pub max_reading_bytes: usize,
    pub retry_after: u64,
}

/// Counters reported by `Front.stats()`.
#[derive(Default)]
pub struct Stats {
    pub accepted: AtomicU64,
    pub uploads_taken: AtomicU64,
    /// Uploads whose frame passed the pre-check (`frames.rs`).
    pub prechecked: AtomicU64,
    pub proxied: AtomicU64,
    pub body_timeouts: AtomicU64,
    pub header_timeouts: AtomicU64,
    pub overloaded: AtomicU64,
    pub evicted: AtomicU64,
    pub client_gone: AtomicU64,
    pub proxy_errors: AtomicU64,
    /// Proxied requests the app did not begin to answer within `upstream_timeout`.
    pub proxy_timeouts: AtomicU64,
}

/// Per-connection state shared between its task, its requests and the eviction scan.
struct ConnState {
    /// Some(since) while waiting for a head; None while a request is being served.
    waiting: watch::Sender<Option<Instant>>,
    /// Wakes the connection's task to close it (eviction).
    kill: Notify,
}

/// Everything the tokio tasks share with the Python object.
pub struct Shared {
    pub config: Config,
    pub stats: Stats,
    pub queue: Queue,
    pub client: Client<hyper_util::client::legacy::connect::HttpConnector, Incoming>,
    /// One permit per byte of the upload bodies being read (`max_reading_bytes`): the memory bodies can hold.
    reading: Semaphore,
    /// Open connections in accept order (the ids grow), for the cap's "oldest waiting" scan.
    conns: Mutex<BTreeMap<u64, Arc<ConnState>>>,
    next_conn: AtomicU64,
    /// Flipped to true by `close()`: stop accepting, wind connections down.
    pub shutdown: watch::Sender<bool>,
    /// The frame pre-check's entries (`frames.rs`), replaced whole by `set_frame_specs`.
    pub specs: RwLock<Arc<Specs>>,
}

impl Shared {
    pub fn new(
        config: Config,
        queue: Queue,
        client: Client<hyper_util::client::legacy::connect::HttpConnector, Incoming>,
    ) -> Self {
        Self {
            reading: Semaphore::new(config.max_reading_bytes.min(Semaphore::MAX_PERMITS)),
            config,
            stats: Stats::default(),
            queue,
            client,
            conns: Mutex::new(BTreeMap::new()),
            next_conn: AtomicU64::new(0),
            shutdown: watch::channel(false).0,
            specs: RwLock::new(Arc::new(Specs::default())),
        }
    }

    pub fn open_connections(&self) -> usize {
        self.conns.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Register a new connection, evicting the oldest one waiting for its head when at the cap.
    fn register(&self) -> (u64, Arc<ConnState>) {
        let id = self.next_conn.fetch_add(1, Relaxed);
        let state = Arc::new(ConnState {
            waiting: watch::channel(Some(Instant::now())).0,
            kill: Notify::new(),
        });
        let mut conns = self.conns.lock().unwrap_or_else(|e| e.into_inner());
        if conns.len() >= self.config.max_connections {
            let victim = conns
                .iter()
                .find(|(_, c)| c.waiting.borrow().is_some())
                .map(|(&id, _)| id);
            if let Some(victim) = victim.and_then(|v| conns.remove(&v)) {
                victim.kill.notify_one(); // stores a permit if the task is not polling yet
                self.stats.evicted.fetch_add(1, Relaxed);
            }
        }
        conns.insert(id, state.clone());
        (id, state)
    }

    fn unregister(&self, id: u64) {
        self.conns
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&id);
    }
}

/// Accept until `close()`; each connection gets its own task.
pub async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    let mut shutdown = shared.shutdown.subscribe();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    shared.stats.accepted.fetch_add(1, Relaxed);
                    tokio::spawn(serve_connection(stream, shared.clone()));
                }
                // out of descriptors and the like: back off instead of spinning
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            },
            _ = shutdown.changed() => break,
        }
    }
}

/// Resolves when the connection has waited `timeout` for a head (from accept or from its last response).
async fn head_overdue(state: &ConnState, timeout: Duration) {
    let mut rx = state.waiting.subscribe();
    loop {
        let since = *rx.borrow_and_update();
        match since {
            Some(t) => tokio::select! {
                _ = tokio::time::sleep_until((t + timeout).into()) => return,
                _ = rx.changed() => {}
            },
            None => {
                let _ = rx.changed().await;
            }
        }
    }
}

async fn serve_connection(stream: TcpStream, shared: Arc<Shared>) {
    let _ = stream.set_nodelay(true);
    let (id, state) = shared.register();
    let service = {
        let (shared, state) = (shared.clone(), state.clone());
        service_fn(move |req| handle(req, shared.clone(), state.clone()))
    };
    let conn = http1::Builder::new()
        .keep_alive(true)
        .pipeline_flush(true) // answers to pipelined requests leave in one write
        .serve_connection(TokioIo::new(stream), service);
    tokio::pin!(conn);
    let mut shutdown = shared.shutdown.subscribe();
    let mut winding_down = *shutdown.borrow_and_update();
    if winding_down {
        conn.as_mut().graceful_shutdown();
    }
    loop {
        tokio::select! {
            _ = conn.as_mut() => break,
            _ = state.kill.notified() => break,
            _ = head_overdue(&state, shared.config.header_timeout) => {
                shared.stats.header_timeouts.fetch_add(1, Relaxed);
                break;
            }
            _ = shutdown.changed(), if !winding_down => {
                winding_down = true;
                conn.as_mut().graceful_shutdown();
            }
        }
    }
    shared.unregister(id);
}

/// Marks its connection as waiting for a head again once hyper drops the response body (fully written, or
/// abandoned with the connection).
struct Waiting(Arc<ConnState>);

impl Drop for Waiting {
    fn drop(&mut self) {
        self.0.waiting.send_replace(Some(Instant::now()));
    }
}

/// A response body that carries the `Waiting` marker.
pub struct TrackedBody {
    inner: AnyBody,
    _waiting: Waiting,
}

impl Body for TrackedBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        Pin::new(&mut self.get_mut().inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

async fn handle(
    req: Request<Incoming>,
    shared: Arc<Shared>,
    state: Arc<ConnState>,
) -> Result<Response<TrackedBody>, Infallible> {
    state.waiting.send_replace(None);
    let waiting = Waiting(state);
    let response = if is_upload(&req, &shared.config) {
        upload(req, &shared).await
    } else {
        crate::proxy::forward(req, &shared).await
    };
    Ok(response.map(|inner| TrackedBody {
        inner,
        _waiting: waiting,
    }))
}

pub fn full(body: Full<Bytes>) -> AnyBody {
    body.map_err(|never| match never {}).boxed_unsync()
}

/// A JSON error answer `{"error": reason, "message": text}`.
pub fn json_error(status: StatusCode, reason: &str, message: &str) -> Response<AnyBody> {
    let escape = |s: &str| {
        s.replace('\\', "\\\\")
            .replace('"', "\\\"")
            .replace(|c: char| c.is_control(), " ")
    };
    let body = format!(
        r#"{{"error":"{}","message":"{}"}}"#,
        escape(reason),
        escape(message)
    );
    let mut resp = Response::new(full(Full::new(Bytes::from(body))));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

fn overloaded(shared: &Shared) -> Response<AnyBody> {
    shared.stats.overloaded.fetch_add(1, Relaxed);
    let mut resp = json_error(
        StatusCode::SERVICE_UNAVAILABLE,
        "overloaded",
        "too many uploads waiting; retry later",
    );
    resp.headers_mut().insert(
        header::RETRY_AFTER,
        HeaderValue::from(shared.config.retry_after),
    );
    resp
}

pub fn shutting_down() -> Response<AnyBody> {
    json_error(
        StatusCode::SERVICE_UNAVAILABLE,
        "shutting_down",
        "the collector is shutting down",
    )
}

/// The fast path's test: POST to the upload path with a listed media type and a Content-Length within the
/// limit, not chunked. Anything else goes to Python's app unchanged, which answers it as it always did.
fn is_upload(req: &Request<Incoming>, config: &Config) -> bool {
    let headers = req.headers();
    if req.method() != Method::POST
        || req.uri().path() != config.upload_path
        || headers.contains_key(header::TRANSFER_ENCODING)
    {
        return false;
    }
    let media = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(|v| {
            v.split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase()
        });
    let listed = media.is_some_and(|m| config.content_types.contains(&m));
    let length = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    listed && length.is_some_and(|n| n <= config.max_body_bytes)
}

/// Bytes of the reading budget one body holds; given back when the body is read whole or abandoned.
struct Held<'a>(&'a Semaphore, usize);

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.0.add_permits(self.1);
    }
}

/// An upload's body, whole within `body_timeout` and within the reading budget (`max_reading_bytes`, taken as
/// the bytes arrive), or the answer that refuses it: 408 `body_timeout` or 503 `overloaded`, both closing the
/// connection, or 400 for a body the client broke off.
async fn read_body(mut body: Incoming, shared: &Shared) -> Result<Bytes, Box<Response<AnyBody>>> {
    let deadline = tokio::time::Instant::now() + shared.config.body_timeout;
    let mut held = Held(&shared.reading, 0);
    let mut buf = bytes::BytesMut::new();
    loop {
        let frame = match tokio::time::timeout_at(deadline, body.frame()).await {
            Err(_) => {
                shared.stats.body_timeouts.fetch_add(1, Relaxed);
                let mut resp = json_error(
                    StatusCode::REQUEST_TIMEOUT,
                    "body_timeout",
                    "the request body did not arrive in time",
                );
                resp.headers_mut()
                    .insert(header::CONNECTION, HeaderValue::from_static("close"));
                return Err(Box::new(resp));
            }
            Ok(None) => break,
            // the client broke the body off (reset, short body): nobody will read this answer
            Ok(Some(Err(e))) => {
                return Err(Box::new(json_error(
                    StatusCode::BAD_REQUEST,
                    "bad_body",
                    &e.to_string(),
                )))
            }
            Ok(Some(Ok(frame))) => frame,
        };
        let Ok(data) = frame.into_data() else {
            continue; // trailers
        };
        let granted = u32::try_from(data.len())
            .ok()
            .and_then(|n| shared.reading.try_acquire_many(n).ok());
        let Some(permit) = granted else {
            let mut resp = overloaded(shared);
            resp.headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
            return Err(Box::new(resp));
        };
        permit.forget();
        held.1 += data.len();
        buf.extend_from_slice(&data);
    }
    Ok(buf.freeze()) // `held` goes back here: what waits for Python is bounded by max_queued
}

/// Drops the answer slot if the request future is dropped first (the client left).
struct Ticket<'a>(&'a Queue, u64);

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        self.0.forget(self.1);
    }
}

fn header_string(req: &Request<Incoming>, name: &str) -> Option<String> {
    req.headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

async fn upload(req: Request<Incoming>, shared: &Shared) -> Response<AnyBody> {
    if shared.queue.full() {
        // before reading the body: hyper then drains the unread body or closes the connection
        return overloaded(shared);
    }
    let content_type = header_string(&req, "content-type").unwrap_or_default();
    let idempotency_key = header_string(&req, "idempotency-key");
    let authorization = header_string(&req, "authorization");
    let origin = header_string(&req, "origin");
    let body = match read_body(req.into_body(), shared).await {
        Ok(body) => body,
        Err(resp) => return *resp,
    };
    // the pre-check reads the body here, on the thread that just received it (its bytes are in this cache)
    let specs = shared
        .specs
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    let checked = specs.check(&body);
    if checked.is_some() {
        shared.stats.prechecked.fetch_add(1, Relaxed);
    }
    let queued = shared.queue.push(Upload {
        ticket: 0,
        checked,
        body,
        content_type,
        idempotency_key,
        authorization,
        origin,
    });
    match queued {
        Err(Refused::Overloaded) => overloaded(shared),
        Err(Refused::ShuttingDown) => shutting_down(),
        Ok((ticket, answer)) => {
            let _ticket = Ticket(&shared.queue, ticket);
            match answer.await {
                Ok(resp) => resp.map(full),
                Err(_) => shutting_down(), // the slot was dropped by close()
            }
        }
    }
}

/// The 503 `shutting_down` for an upload still queued when `close()` runs, as an answer slot takes it.
pub fn shutting_down_answer() -> crate::queue::Answer {
    let mut resp = Response::new(Full::new(Bytes::from_static(
        br#"{"error":"shutting_down","message":"the collector is shutting down"}"#,
    )));
    *resp.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}
