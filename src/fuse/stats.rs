//! Requests counted per opcode, with the time the daemon spent on each kind: what each
//! operation costs in round trips, readable from a live mount (`dxfs stats`) and logged at
//! unmount. Counting is a pair of relaxed atomic adds (and a max) per request.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::wire::opcode;

/// Opcodes counted: every one below this (the kernel's are all below 64).
const OPCODES: usize = 64;

/// The kernel's name of an opcode (FUSE_LOOKUP is "LOOKUP").
fn name(op: u32) -> &'static str {
    match op {
        opcode::LOOKUP => "LOOKUP",
        opcode::FORGET => "FORGET",
        opcode::GETATTR => "GETATTR",
        opcode::SETATTR => "SETATTR",
        opcode::READLINK => "READLINK",
        opcode::SYMLINK => "SYMLINK",
        opcode::MKNOD => "MKNOD",
        opcode::MKDIR => "MKDIR",
        opcode::UNLINK => "UNLINK",
        opcode::RMDIR => "RMDIR",
        opcode::RENAME => "RENAME",
        opcode::LINK => "LINK",
        opcode::OPEN => "OPEN",
        opcode::READ => "READ",
        opcode::WRITE => "WRITE",
        opcode::STATFS => "STATFS",
        opcode::RELEASE => "RELEASE",
        opcode::FSYNC => "FSYNC",
        opcode::SETXATTR => "SETXATTR",
        opcode::GETXATTR => "GETXATTR",
        opcode::LISTXATTR => "LISTXATTR",
        opcode::REMOVEXATTR => "REMOVEXATTR",
        opcode::FLUSH => "FLUSH",
        opcode::INIT => "INIT",
        opcode::OPENDIR => "OPENDIR",
        opcode::READDIR => "READDIR",
        opcode::RELEASEDIR => "RELEASEDIR",
        opcode::FSYNCDIR => "FSYNCDIR",
        opcode::GETLK => "GETLK",
        opcode::SETLK => "SETLK",
        opcode::SETLKW => "SETLKW",
        opcode::ACCESS => "ACCESS",
        opcode::CREATE => "CREATE",
        opcode::INTERRUPT => "INTERRUPT",
        opcode::BMAP => "BMAP",
        opcode::DESTROY => "DESTROY",
        opcode::IOCTL => "IOCTL",
        opcode::POLL => "POLL",
        opcode::NOTIFY_REPLY => "NOTIFY_REPLY",
        opcode::BATCH_FORGET => "BATCH_FORGET",
        opcode::FALLOCATE => "FALLOCATE",
        opcode::READDIRPLUS => "READDIRPLUS",
        opcode::RENAME2 => "RENAME2",
        opcode::LSEEK => "LSEEK",
        opcode::COPY_FILE_RANGE => "COPY_FILE_RANGE",
        opcode::SYNCFS => "SYNCFS",
        opcode::TMPFILE => "TMPFILE",
        opcode::STATX => "STATX",
        _ => "OTHER",
    }
}

#[derive(Default)]
struct Counter {
    count: AtomicU64,
    nanos: AtomicU64,
    /// The longest one.
    max_nanos: AtomicU64,
}

/// Counters of one mount.
pub(super) struct RequestStats {
    counters: [Counter; OPCODES],
    /// Requests that came through io_uring queues (the rest came through /dev/fuse).
    via_ring: AtomicU64,
    /// Requests (mostly WRITEs) a serving thread handed to its kept threads because they
    /// had to wait: for room in the delta, or for files removed moments ago to be let go.
    pub(super) writes_waited: AtomicU64,
    /// READDIRPLUS entries sent without attributes: the kernel held them fresh.
    pub(super) entries_without_attrs: AtomicU64,
    since: Instant,
}

impl Default for RequestStats {
    fn default() -> Self {
        RequestStats {
            counters: std::array::from_fn(|_| Counter::default()),
            via_ring: AtomicU64::new(0),
            writes_waited: AtomicU64::new(0),
            entries_without_attrs: AtomicU64::new(0),
            since: Instant::now(),
        }
    }
}

/// Records one request when dropped.
pub(super) struct Timer<'a> {
    counter: &'a Counter,
    start: Instant,
}

impl Drop for Timer<'_> {
    fn drop(&mut self) {
        let ns = self.start.elapsed().as_nanos().min(u128::from(u64::MAX)) as u64;
        self.counter.count.fetch_add(1, Ordering::Relaxed);
        self.counter.nanos.fetch_add(ns, Ordering::Relaxed);
        self.counter.max_nanos.fetch_max(ns, Ordering::Relaxed);
    }
}

impl RequestStats {
    /// Count a request with opcode `op`, timing it until the returned guard drops.
    pub(super) fn timer(&self, op: u32, via_ring: bool) -> Timer<'_> {
        self.timer_since(op, via_ring, Instant::now())
    }

    /// [`RequestStats::timer`] for a request being served since `start` (one whose
    /// serving may turn out to be done elsewhere, counted only once it is not).
    pub(super) fn timer_since(&self, op: u32, via_ring: bool, start: Instant) -> Timer<'_> {
        if via_ring {
            self.via_ring.fetch_add(1, Ordering::Relaxed);
        }
        let i = (op as usize).min(OPCODES - 1);
        Timer { counter: &self.counters[i], start }
    }

    /// (opcode name, requests, time spent, longest) of every opcode seen, busiest first.
    pub(super) fn snapshot(&self) -> Vec<(&'static str, u64, Duration, Duration)> {
        let mut v: Vec<_> = (0..OPCODES)
            .map(|op| {
                let c = &self.counters[op];
                (
                    name(op as u32),
                    c.count.load(Ordering::Relaxed),
                    Duration::from_nanos(c.nanos.load(Ordering::Relaxed)),
                    Duration::from_nanos(c.max_nanos.load(Ordering::Relaxed)),
                )
            })
            .filter(|&(_, n, _, _)| n > 0)
            .collect();
        v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
        v
    }

    /// The counters as one JSON object: `{"transport": T, "seconds": S, "requests": N, "via_ring": R,
    /// "writes_waited": W, "entries_without_attrs": E, "ops": {"LOOKUP":
    /// {"count": n, "total_us": t, "mean_us": m, "max_us": x}, ...}}`.
    pub(super) fn json(&self, transport: &str) -> String {
        let snap = self.snapshot();
        let total: u64 = snap.iter().map(|s| s.1).sum();
        let ops: Vec<String> = snap
            .iter()
            .map(|(name, n, d, max)| {
                let us = d.as_secs_f64() * 1e6;
                format!(
                    "\"{name}\":{{\"count\":{n},\"total_us\":{us:.0},\"mean_us\":{:.2},\"max_us\":{:.0}}}",
                    us / *n as f64,
                    max.as_secs_f64() * 1e6
                )
            })
            .collect();
        format!(
            "{{\"transport\":\"{}\",\"seconds\":{:.3},\"requests\":{total},\"via_ring\":{},\"writes_waited\":{},\"entries_without_attrs\":{},\"ops\":{{{}}}}}",
            transport.replace(['"', '\\'], ""),
            self.since.elapsed().as_secs_f64(),
            self.via_ring.load(Ordering::Relaxed),
            self.writes_waited.load(Ordering::Relaxed),
            self.entries_without_attrs.load(Ordering::Relaxed),
            ops.join(",")
        )
    }

    /// One line for the log: `LOOKUP 1200 (3.1 µs), CREATE 1000 (9.0 µs), ...`.
    pub(super) fn summary(&self) -> String {
        let parts: Vec<String> = self
            .snapshot()
            .iter()
            .map(|(name, n, d, _)| format!("{name} {n} ({:.1} µs)", d.as_secs_f64() * 1e6 / *n as f64))
            .collect();
        if parts.is_empty() {
            "no requests".into()
        } else {
            parts.join(", ")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_and_reports_every_op() {
        let s = RequestStats::default();
        for _ in 0..3 {
            drop(s.timer(opcode::LOOKUP, false));
        }
        drop(s.timer(opcode::CREATE, true));
        drop(s.timer(999, false)); // out of range: counted as OTHER
        let snap = s.snapshot();
        assert_eq!(
            snap.iter().map(|x| (x.0, x.1)).collect::<Vec<_>>(),
            vec![("LOOKUP", 3), ("CREATE", 1), ("OTHER", 1)]
        );
        let j = s.json("io_uring");
        assert!(j.starts_with("{\"transport\":\"io_uring\","), "{j}");
        assert!(j.contains("\"requests\":5"), "{j}");
        assert!(j.contains("\"via_ring\":1"), "{j}");
        assert!(j.contains("\"LOOKUP\":{\"count\":3,"), "{j}");
        assert!(j.contains("\"max_us\":"), "{j}");
        assert!(snap.iter().all(|x| x.3 <= x.2), "the longest is within the total");
        assert!(s.summary().starts_with("LOOKUP 3 ("), "{}", s.summary());
    }
}
