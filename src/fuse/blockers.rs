//! The threads of an io_uring queue that answer the requests that may block (FSYNC, and a
//! WRITE that turned out to have to wait for room), kept between requests
//! (`transport::serve_queue` runs them).
#![forbid(unsafe_code)]

use std::collections::VecDeque;

/// The threads of one queue that answer the requests that may block (FSYNC, and a WRITE
/// that must wait for room), so the queue thread goes on serving the others meanwhile. They are kept once
/// started and wait for the next one: a thread started and ended per fsync cost more than
/// the commit of a one-page fsync itself. A new one starts only when every kept one is
/// busy, so no blocking request waits behind another.
pub(super) struct Blockers<T> {
    state: parking_lot::Mutex<State<T>>,
    wake: parking_lot::Condvar,
}

struct State<T> {
    work: VecDeque<T>,
    /// Threads waiting for work.
    idle: usize,
    /// The queue is ending: threads leave once the work is done.
    stop: bool,
}

impl<T> Default for Blockers<T> {
    fn default() -> Self {
        let state = State { work: VecDeque::new(), idle: 0, stop: false };
        Blockers { state: parking_lot::Mutex::new(state), wake: parking_lot::Condvar::new() }
    }
}

impl<T> Blockers<T> {
    /// Queue `d`; true when no kept thread is free for it, so the caller starts one.
    pub(super) fn push(&self, d: T) -> bool {
        let mut s = self.state.lock();
        s.work.push_back(d);
        if s.idle >= s.work.len() {
            self.wake.notify_one();
            false
        } else {
            true
        }
    }

    /// The next request to answer, waiting for one; None once the queue ends.
    pub(super) fn next(&self) -> Option<T> {
        let mut s = self.state.lock();
        loop {
            if let Some(d) = s.work.pop_front() {
                return Some(d);
            }
            if s.stop {
                return None;
            }
            s.idle += 1;
            self.wake.wait(&mut s);
            s.idle -= 1;
        }
    }

    /// End the pool: every thread leaves once the queued work is done.
    pub(super) fn stop(&self) {
        self.state.lock().stop = true;
        self.wake.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A blocking request starts a thread only when no kept one is free; a kept one gets
    /// the next request, in order; every thread leaves at the queue's end.
    #[test]
    fn blockers_are_kept_and_started_only_when_all_are_busy() {
        // Requests are numbers here.
        let d = |ent: usize| ent;
        let b = Blockers::<usize>::default();
        // Stops the pool however the test ends, so a failed assertion cannot leave the
        // thread waiting and the scope with it.
        struct StopOnDrop<'a>(&'a Blockers<usize>);
        impl Drop for StopOnDrop<'_> {
            fn drop(&mut self) {
                self.0.stop();
            }
        }
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::scope(|s| {
            let _stop = StopOnDrop(&b);
            // The thread reports each request and holds it (stays busy) until let go.
            let (go, gate) = std::sync::mpsc::channel::<()>();
            assert!(b.push(d(1)), "no thread yet: start one");
            let (b, tx) = (&b, &tx);
            s.spawn(move || {
                while let Some(x) = b.next() {
                    tx.send(x).unwrap();
                    if gate.recv().is_err() {
                        return;
                    }
                }
            });
            assert_eq!(rx.recv().unwrap(), 1);
            assert!(b.push(d(2)), "the one thread is busy: start another");
            go.send(()).unwrap();
            assert_eq!(rx.recv().unwrap(), 2, "a kept thread takes the next request");
            go.send(()).unwrap();
            while b.state.lock().idle == 0 {
                std::thread::yield_now();
            }
            assert!(!b.push(d(3)), "a free thread takes it");
            assert_eq!(rx.recv().unwrap(), 3);
            go.send(()).unwrap();
        });
        assert_eq!(b.next(), None, "a stopped pool hands out nothing");
    }
}
