//! `ldp_front`: the collector's native upload front (issue 31, "Collector CPU per report"; how the collector
//! uses it: docs/COLLECTOR.md, "The native front", and collector/http/frontend.py).
//!
//! `Front(fd, upstream, *, upload_path, content_types, max_body_bytes, body_timeout, header_timeout,
//! max_connections, max_queued, retry_after, threads, max_reading_bytes, upstream_timeout)` serves the listening
//! socket `fd`;
//! `set_frame_specs(entries)`, `notify_fd()`, `take_nowait(n)` / `take(n, timeout)`, `answer(...)` / `answer_many(...)`, `stats()` and
//! `close(grace)` are the Python side's whole interface (tests/collector/test_native_front.py).
//!
//! Why: any request served by Python costs ~35 us of CPU before the collector does any work (uvicorn,
//! granian alike), so the collector cannot get close to the cost of reading the bytes while Python parses
//! HTTP and wakes a coroutine per upload. This module serves HTTP/1.1 on tokio worker threads, with the GIL
//! released, and hands the uploads to Python in batches: Python's event loop watches one eventfd, takes every
//! waiting upload in one call and answers them in one call. Everything else (other routes, other media types,
//! bodies over the limit, chunked bodies) is reverse-proxied to the Python app, which answers as it always
//! did, so each error answer, route and header keeps a single implementation.
//!
//! Layout: `queue.rs` is the hand-off (queue, answer slots, eventfd), `server.rs` the connections and the
//! fast path, `proxy.rs` the reverse proxy; this file is the Python class.

mod frames;
mod proxy;
mod queue;
mod server;

use std::collections::HashMap;
use std::os::fd::{BorrowedFd, RawFd};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{self, HeaderName, HeaderValue};
use hyper::{Response, StatusCode};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::pybacked::PyBackedBytes;
use pyo3::types::PyBytes;

use queue::{Answer, Queue, Upload};
use server::{Config, Shared};

type Headers = Vec<(PyBackedBytes, PyBackedBytes)>;
/// A pre-checked frame's fields: (metric, spec id in hex, day, record size, records, batch id, sealed,
/// records checked).
type CheckedFields<'py> = (
    String,
    String,
    u32,
    u32,
    u32,
    Bound<'py, PyBytes>,
    bool,
    bool,
);
type Taken<'py> = Vec<(
    u64,
    Bound<'py, PyBytes>,
    String,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<CheckedFields<'py>>,
)>;
/// One entry of `set_frame_specs`: (metric, sealed, spec id (8 bytes), record size,
/// [(offset, width, count, bound)], records checked, [key id]).
type SpecEntry = (
    String,
    bool,
    Vec<u8>,
    u32,
    Vec<(usize, usize, usize, u64)>,
    bool,
    Vec<Vec<u8>>,
);

/// Serves HTTP/1.1 on a listening socket: uploads are queued for Python, the rest goes to `upstream`.
#[pyclass(module = "ldp_front", frozen)]
struct Front {
    shared: Arc<Shared>,
    runtime: Mutex<Option<tokio::runtime::Runtime>>,
}

fn secs(name: &str, value: f64) -> PyResult<Duration> {
    Duration::try_from_secs_f64(value)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| {
            PyValueError::new_err(format!("{name} must be a positive number of seconds"))
        })
}

/// Python's answer as a response: its status, body and headers, plus a JSON content type unless it gave one
/// (hyper adds Content-Length; a `connection: close` among the headers closes the connection after it).
fn build_answer(status: u16, body: &[u8], headers: &Headers) -> PyResult<Answer> {
    let mut resp = Response::new(Full::new(Bytes::copy_from_slice(body)));
    *resp.status_mut() = StatusCode::from_u16(status)
        .map_err(|_| PyValueError::new_err(format!("bad HTTP status {status}")))?;
    let map = resp.headers_mut();
    for (name, value) in headers {
        let name =
            HeaderName::from_bytes(name).map_err(|_| PyValueError::new_err("bad header name"))?;
        if name == header::CONTENT_LENGTH || name == header::TRANSFER_ENCODING {
            continue; // framing is hyper's
        }
        let value = HeaderValue::from_bytes(value)
            .map_err(|_| PyValueError::new_err("bad header value"))?;
        map.append(name, value);
    }
    if !map.contains_key(header::CONTENT_TYPE) {
        map.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
    }
    Ok(resp)
}

fn to_python<'py>(py: Python<'py>, uploads: Vec<Upload>) -> Taken<'py> {
    uploads
        .into_iter()
        .map(|u| {
            (
                u.ticket,
                PyBytes::new(py, &u.body),
                u.content_type,
                u.idempotency_key,
                u.authorization,
                u.origin,
                u.checked.map(|c| checked_fields(py, c)),
            )
        })
        .collect()
}

fn checked_fields(py: Python<'_>, c: frames::Checked) -> CheckedFields<'_> {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut spec_id = String::with_capacity(16);
    for b in c.spec_id {
        spec_id.push(HEX[usize::from(b >> 4)] as char);
        spec_id.push(HEX[usize::from(b & 15)] as char);
    }
    (
        c.metric,
        spec_id,
        c.day,
        c.record_size,
        c.n_records,
        PyBytes::new(py, &c.batch_id),
        c.sealed,
        c.records_checked,
    )
}

#[pymethods]
impl Front {
    #[new]
    #[pyo3(signature = (
        fd, upstream, upload_path="/v1/reports".to_owned(),
        content_types=vec!["application/vnd.ldp.frame".to_owned(), "application/octet-stream".to_owned()],
        max_body_bytes=1 << 20, body_timeout=10.0, header_timeout=10.0, max_connections=10_000,
        max_queued=4096, retry_after=1, threads=1, max_reading_bytes=1 << 30, upstream_timeout=60.0,
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        fd: RawFd,
        upstream: Option<String>,
        upload_path: String,
        content_types: Vec<String>,
        max_body_bytes: u64,
        body_timeout: f64,
        header_timeout: f64,
        max_connections: usize,
        max_queued: usize,
        retry_after: u64,
        threads: usize,
        max_reading_bytes: usize,
        upstream_timeout: f64,
    ) -> PyResult<Self> {
        if fd < 0 {
            return Err(PyValueError::new_err("fd must be an open listening socket"));
        }
        if threads == 0 || max_connections == 0 || max_queued == 0 || max_reading_bytes == 0 {
            return Err(PyValueError::new_err(
                "threads, max_connections, max_queued and max_reading_bytes must be positive",
            ));
        }
        let config = Config {
            upstream,
            upload_path,
            content_types: content_types
                .iter()
                .map(|c| c.trim().to_ascii_lowercase())
                .collect(),
            max_body_bytes,
            body_timeout: secs("body_timeout", body_timeout)?,
            header_timeout: secs("header_timeout", header_timeout)?,
            upstream_timeout: secs("upstream_timeout", upstream_timeout)?,
            max_connections,
            max_reading_bytes,
            retry_after,
        };
        // Python keeps its socket; we serve on our own duplicate of it.
        // SAFETY: borrow_raw only needs `fd` open for the duration of this call, which the caller guarantees.
        let owned = unsafe { BorrowedFd::borrow_raw(fd) }.try_clone_to_owned()?;
        let listener = std::net::TcpListener::from(owned);
        listener.set_nonblocking(true)?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .thread_name("ldp-front")
            .enable_all()
            .build()?;
        let _entered = runtime.enter(); // from_std and the client's pool need a reactor / timer
        let listener = tokio::net::TcpListener::from_std(listener)?;
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        let client = Client::builder(TokioExecutor::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .build(connector);
        let shared = Arc::new(Shared::new(config, Queue::new(max_queued)?, client));
        runtime.spawn(server::accept_loop(listener, shared.clone()));
        drop(_entered);
        Ok(Self {
            shared,
            runtime: Mutex::new(Some(runtime)),
        })
    }

    /// An eventfd, readable while uploads wait to be taken (for `loop.add_reader`).
    fn notify_fd(&self) -> RawFd {
        self.shared.queue.notify_fd()
    }

    /// What the frame pre-check accepts (`frames.rs`), replacing what was set before: one entry per metric and
    /// sealing, `(metric, sealed, spec_id, record_size, [(offset, width, count, bound)], records_checked,
    /// [key_id])`: a sealed frame passes only if each record begins with one of the key ids (when any).
    /// Uploads read from now on are checked against it.
    fn set_frame_specs(&self, entries: Vec<SpecEntry>) -> PyResult<()> {
        let mut specs = frames::Specs::default();
        for (metric, sealed, spec_id, record_size, bounds, records_checked, key_ids) in entries {
            let spec_id: [u8; 8] = spec_id
                .as_slice()
                .try_into()
                .map_err(|_| PyValueError::new_err("a spec id is 8 bytes"))?;
            if record_size == 0 {
                return Err(PyValueError::new_err("a record size is positive"));
            }
            let mut checks = Vec::with_capacity(bounds.len());
            for (offset, width, count, bound) in bounds {
                if !matches!(width, 1 | 2 | 4 | 8) || offset + width * count > record_size as usize
                {
                    return Err(PyValueError::new_err(format!(
                        "metric {metric:?}: a bounded field must be 1, 2, 4 or 8-byte unsigned integers within the record"
                    )));
                }
                checks.push(frames::Bound {
                    offset,
                    width,
                    count,
                    bound,
                });
            }
            let k = key_ids.first().map_or(0, Vec::len);
            if key_ids
                .iter()
                .any(|id| id.is_empty() || id.len() != k || k > record_size as usize)
            {
                return Err(PyValueError::new_err(format!(
                    "metric {metric:?}: key ids are of one positive length, within the record"
                )));
            }
            let entry = frames::Entry {
                spec_id,
                record_size,
                bounds: checks,
                records_checked,
                key_ids,
            };
            specs.insert(metric.into_bytes(), sealed, entry);
        }
        *self.shared.specs.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(specs);
        Ok(())
    }

    /// The pre-check of `body` against the entries set (what an upload of it would carry as `checked`).
    fn check_frame<'py>(&self, py: Python<'py>, body: &[u8]) -> Option<CheckedFields<'py>> {
        let specs = self
            .shared
            .specs
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        specs.check(body).map(|c| checked_fields(py, c))
    }

    /// Up to `max_items` waiting uploads, at once: (ticket, body, content_type, idempotency_key,
    /// authorization, origin, checked), `checked` the frame's fields when the pre-check passed (`frames.rs`,
    /// `set_frame_specs`), else None. Clears the eventfd when it empties the queue.
    fn take_nowait<'py>(&self, py: Python<'py>, max_items: usize) -> Taken<'py> {
        let uploads = self.shared.queue.take_nowait(max_items);
        self.shared
            .stats
            .uploads_taken
            .fetch_add(uploads.len() as u64, Relaxed);
        to_python(py, uploads)
    }

    /// Like `take_nowait`, but waits up to `timeout` s (GIL released) for the first upload; [] on timeout.
    fn take<'py>(&self, py: Python<'py>, max_items: usize, timeout: f64) -> PyResult<Taken<'py>> {
        let timeout = Duration::try_from_secs_f64(timeout)
            .map_err(|_| PyValueError::new_err("bad timeout"))?;
        let uploads = py.detach(|| self.shared.queue.take(max_items, timeout));
        self.shared
            .stats
            .uploads_taken
            .fetch_add(uploads.len() as u64, Relaxed);
        Ok(to_python(py, uploads))
    }

    /// Answer one upload; False when its client is gone (or the ticket is unknown).
    fn answer(
        &self,
        ticket: u64,
        status: u16,
        body: PyBackedBytes,
        headers: Headers,
    ) -> PyResult<bool> {
        let answer = build_answer(status, &body, &headers)?;
        Ok(self.deliver(vec![(ticket, answer)]) == 1)
    }

    /// Answer many uploads in one call; returns how many reached a live client.
    fn answer_many(&self, answers: Vec<(u64, u16, PyBackedBytes, Headers)>) -> PyResult<usize> {
        let built = answers
            .iter()
            .map(|(ticket, status, body, headers)| {
                Ok((*ticket, build_answer(*status, body, headers)?))
            })
            .collect::<PyResult<Vec<_>>>()?;
        Ok(self.deliver(built))
    }

    fn stats(&self) -> HashMap<&'static str, u64> {
        let s = &self.shared.stats;
        HashMap::from([
            ("connections", self.shared.open_connections() as u64),
            ("accepted", s.accepted.load(Relaxed)),
            ("queued", self.shared.queue.len() as u64),
            ("uploads_taken", s.uploads_taken.load(Relaxed)),
            ("prechecked", s.prechecked.load(Relaxed)),
            ("proxied", s.proxied.load(Relaxed)),
            ("body_timeouts", s.body_timeouts.load(Relaxed)),
            ("header_timeouts", s.header_timeouts.load(Relaxed)),
            ("overloaded", s.overloaded.load(Relaxed)),
            ("evicted", s.evicted.load(Relaxed)),
            ("client_gone", s.client_gone.load(Relaxed)),
            ("proxy_timeouts", s.proxy_timeouts.load(Relaxed)),
            ("proxy_errors", s.proxy_errors.load(Relaxed)),
        ])
    }

    /// Stop accepting, answer untaken uploads 503 `shutting_down`, let busy connections finish (answers to
    /// taken uploads still go out) for up to `grace` s, then stop the worker threads. Idempotent.
    fn close(&self, py: Python<'_>, grace: f64) -> PyResult<()> {
        let grace = Duration::try_from_secs_f64(grace.max(0.0))
            .map_err(|_| PyValueError::new_err("bad grace"))?;
        let Some(runtime) = self
            .runtime
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        else {
            return Ok(());
        };
        py.detach(|| {
            for slot in self.shared.queue.close() {
                let _ = slot.send(server::shutting_down_answer());
            }
            self.shared.shutdown.send_replace(true);
            let deadline = Instant::now() + grace;
            while self.shared.open_connections() > 0 && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
            runtime.shutdown_timeout(Duration::from_millis(100));
        });
        Ok(())
    }
}

impl Front {
    fn deliver(&self, answers: Vec<(u64, Answer)>) -> usize {
        let n = answers.len();
        let reached = self.shared.queue.answer(answers);
        self.shared
            .stats
            .client_gone
            .fetch_add((n - reached) as u64, Relaxed);
        reached
    }
}

impl Drop for Front {
    fn drop(&mut self) {
        if let Some(runtime) = self
            .runtime
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            self.shared.queue.close();
            runtime.shutdown_background();
        }
    }
}

#[pymodule]
fn ldp_front(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Front>()?;
    Ok(())
}
