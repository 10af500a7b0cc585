//! The hand-off between tokio and Python: uploads waiting to be taken, and the answers Python owes them.
//!
//! One mutex guards both the queue and the table of pending answers, so an upload is either queued with its
//! answer slot or refused (overloaded / shutting down), never half of each. The eventfd that Python's event
//! loop watches is written only when the queue goes from empty to non-empty and drained only when a take
//! empties it (both under the same lock), so it is readable exactly while uploads wait: one wake-up per
//! batch, not per upload.

use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use hyper::Response;
use tokio::sync::oneshot;

/// Python's answer to one upload, ready for hyper.
pub type Answer = Response<Full<Bytes>>;

/// One upload read by Rust, as Python receives it.
pub struct Upload {
    pub ticket: u64,
    pub body: Bytes,
    pub content_type: String,
    pub idempotency_key: Option<String>,
    pub authorization: Option<String>,
    pub origin: Option<String>,
    /// The frame's fields when the pre-check passed (`frames.rs`), else `None`.
    pub checked: Option<crate::frames::Checked>,
}

/// Why an upload could not be queued.
pub enum Refused {
    Overloaded,
    ShuttingDown,
}

struct Inner {
    queued: VecDeque<Upload>,
    pending: HashMap<u64, oneshot::Sender<Answer>>,
    next_ticket: u64,
    closed: bool,
}

pub struct Queue {
    inner: Mutex<Inner>,
    ready: Condvar,
    eventfd: File,
    max_queued: usize,
}

impl Queue {
    pub fn new(max_queued: usize) -> std::io::Result<Self> {
        // SAFETY: eventfd(2) takes no pointers; a non-negative result is a fresh descriptor we alone own.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `fd` was just returned by eventfd and is owned by nothing else.
        let owned = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Self {
            inner: Mutex::new(Inner {
                queued: VecDeque::new(),
                pending: HashMap::new(),
                next_ticket: 1,
                closed: false,
            }),
            ready: Condvar::new(),
            eventfd: File::from(owned),
            max_queued,
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // a panic while holding the lock leaves plain data behind: keep serving rather than poison every call
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn notify_fd(&self) -> RawFd {
        self.eventfd.as_raw_fd()
    }

    pub fn len(&self) -> usize {
        self.lock().queued.len()
    }

    /// Cheap early refusal before a body is read (the definitive check is in `push`).
    pub fn full(&self) -> bool {
        self.len() >= self.max_queued
    }

    /// Queue an upload (its ticket is assigned here); the receiver gets Python's answer.
    pub fn push(&self, mut upload: Upload) -> Result<(u64, oneshot::Receiver<Answer>), Refused> {
        let mut inner = self.lock();
        if inner.closed {
            return Err(Refused::ShuttingDown);
        }
        if inner.queued.len() >= self.max_queued {
            return Err(Refused::Overloaded);
        }
        let ticket = inner.next_ticket;
        inner.next_ticket += 1;
        upload.ticket = ticket;
        let (tx, rx) = oneshot::channel();
        inner.pending.insert(ticket, tx);
        inner.queued.push_back(upload);
        if inner.queued.len() == 1 {
            // a full counter (EAGAIN) is still readable, which is all Python needs
            let _ = (&self.eventfd).write(&1u64.to_ne_bytes());
            self.ready.notify_all();
        }
        Ok((ticket, rx))
    }

    /// Forget the answer slot of an upload whose client is gone (its request future was dropped).
    pub fn forget(&self, ticket: u64) {
        self.lock().pending.remove(&ticket);
    }

    fn drain(&self, inner: &mut Inner, max_items: usize) -> Vec<Upload> {
        let n = max_items.min(inner.queued.len());
        let out: Vec<Upload> = inner.queued.drain(..n).collect();
        if inner.queued.is_empty() {
            let mut buf = [0u8; 8];
            let _ = (&self.eventfd).read(&mut buf); // EAGAIN when already clear
        }
        out
    }

    pub fn take_nowait(&self, max_items: usize) -> Vec<Upload> {
        let mut inner = self.lock();
        self.drain(&mut inner, max_items)
    }

    /// Wait up to `timeout` for uploads (returns at once when closed). Call without the GIL.
    pub fn take(&self, max_items: usize, timeout: Duration) -> Vec<Upload> {
        let deadline = Instant::now() + timeout;
        let mut inner = self.lock();
        while inner.queued.is_empty() && !inner.closed {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            inner = self
                .ready
                .wait_timeout(inner, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        self.drain(&mut inner, max_items)
    }

    /// Deliver answers; returns how many reached a request still waiting for one.
    pub fn answer(&self, answers: Vec<(u64, Answer)>) -> usize {
        let senders: Vec<_> = {
            let mut inner = self.lock();
            answers
                .into_iter()
                .map(|(ticket, answer)| (inner.pending.remove(&ticket), answer))
                .collect()
        };
        senders
            .into_iter()
            .filter_map(|(tx, answer)| tx?.send(answer).ok())
            .count()
    }

    /// Refuse new uploads; hand back the untaken ones' answer slots (the caller answers them 503).
    pub fn close(&self) -> Vec<oneshot::Sender<Answer>> {
        let mut inner = self.lock();
        inner.closed = true;
        let untaken: Vec<Upload> = inner.queued.drain(..).collect();
        let mut buf = [0u8; 8];
        let _ = (&self.eventfd).read(&mut buf);
        self.ready.notify_all();
        untaken
            .iter()
            .filter_map(|u| inner.pending.remove(&u.ticket))
            .collect()
    }
}
