//! Requests counted per opcode, with the time the daemon spent on each kind: what each
//! operation costs in round trips, readable from a live mount (`dxfs stats`) and logged at
//! unmount. Counting is a pair of relaxed atomic adds per request.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The requests the adapter serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Op {
    Lookup,
    Forget,
    Getattr,
    Setattr,
    Readlink,
    Mknod,
    Mkdir,
    Unlink,
    Rmdir,
    Symlink,
    Rename,
    Link,
    Open,
    Read,
    Write,
    Flush,
    Release,
    Fsync,
    Opendir,
    Releasedir,
    Readdir,
    Readdirplus,
    Fsyncdir,
    Statfs,
    Setxattr,
    Getxattr,
    Listxattr,
    Removexattr,
    Access,
    Create,
    Fallocate,
    CopyFileRange,
}

const OPS: [Op; 32] = [
    Op::Lookup,
    Op::Forget,
    Op::Getattr,
    Op::Setattr,
    Op::Readlink,
    Op::Mknod,
    Op::Mkdir,
    Op::Unlink,
    Op::Rmdir,
    Op::Symlink,
    Op::Rename,
    Op::Link,
    Op::Open,
    Op::Read,
    Op::Write,
    Op::Flush,
    Op::Release,
    Op::Fsync,
    Op::Opendir,
    Op::Releasedir,
    Op::Readdir,
    Op::Readdirplus,
    Op::Fsyncdir,
    Op::Statfs,
    Op::Setxattr,
    Op::Getxattr,
    Op::Listxattr,
    Op::Removexattr,
    Op::Access,
    Op::Create,
    Op::Fallocate,
    Op::CopyFileRange,
];

impl Op {
    /// The kernel's name of the opcode (FUSE_LOOKUP is "LOOKUP").
    fn name(self) -> &'static str {
        match self {
            Op::Lookup => "LOOKUP",
            Op::Forget => "FORGET",
            Op::Getattr => "GETATTR",
            Op::Setattr => "SETATTR",
            Op::Readlink => "READLINK",
            Op::Mknod => "MKNOD",
            Op::Mkdir => "MKDIR",
            Op::Unlink => "UNLINK",
            Op::Rmdir => "RMDIR",
            Op::Symlink => "SYMLINK",
            Op::Rename => "RENAME",
            Op::Link => "LINK",
            Op::Open => "OPEN",
            Op::Read => "READ",
            Op::Write => "WRITE",
            Op::Flush => "FLUSH",
            Op::Release => "RELEASE",
            Op::Fsync => "FSYNC",
            Op::Opendir => "OPENDIR",
            Op::Releasedir => "RELEASEDIR",
            Op::Readdir => "READDIR",
            Op::Readdirplus => "READDIRPLUS",
            Op::Fsyncdir => "FSYNCDIR",
            Op::Statfs => "STATFS",
            Op::Setxattr => "SETXATTR",
            Op::Getxattr => "GETXATTR",
            Op::Listxattr => "LISTXATTR",
            Op::Removexattr => "REMOVEXATTR",
            Op::Access => "ACCESS",
            Op::Create => "CREATE",
            Op::Fallocate => "FALLOCATE",
            Op::CopyFileRange => "COPY_FILE_RANGE",
        }
    }
}

#[derive(Default)]
struct Counter {
    count: AtomicU64,
    nanos: AtomicU64,
}

/// Counters of one mount.
pub(super) struct RequestStats {
    counters: [Counter; OPS.len()],
    since: Instant,
}

impl Default for RequestStats {
    fn default() -> Self {
        RequestStats { counters: Default::default(), since: Instant::now() }
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
    }
}

impl RequestStats {
    /// Count a request of kind `op`, timing it until the returned guard drops.
    pub(super) fn timer(&self, op: Op) -> Timer<'_> {
        Timer { counter: &self.counters[op as usize], start: Instant::now() }
    }

    /// (opcode name, requests, time spent) of every opcode seen, busiest first.
    pub(super) fn snapshot(&self) -> Vec<(&'static str, u64, Duration)> {
        let mut v: Vec<_> = OPS
            .iter()
            .map(|&op| {
                let c = &self.counters[op as usize];
                (op.name(), c.count.load(Ordering::Relaxed), Duration::from_nanos(c.nanos.load(Ordering::Relaxed)))
            })
            .filter(|&(_, n, _)| n > 0)
            .collect();
        v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
        v
    }

    /// The counters as one JSON object: `{"seconds": S, "requests": N, "ops": {"LOOKUP":
    /// {"count": n, "total_us": t, "mean_us": m}, ...}}`.
    pub(super) fn json(&self) -> String {
        let snap = self.snapshot();
        let total: u64 = snap.iter().map(|s| s.1).sum();
        let ops: Vec<String> = snap
            .iter()
            .map(|(name, n, d)| {
                let us = d.as_secs_f64() * 1e6;
                format!("\"{name}\":{{\"count\":{n},\"total_us\":{us:.0},\"mean_us\":{:.2}}}", us / *n as f64)
            })
            .collect();
        format!(
            "{{\"seconds\":{:.3},\"requests\":{total},\"ops\":{{{}}}}}",
            self.since.elapsed().as_secs_f64(),
            ops.join(",")
        )
    }

    /// One line for the log: `LOOKUP 1200 (3.1 µs), CREATE 1000 (9.0 µs), ...`.
    pub(super) fn summary(&self) -> String {
        let parts: Vec<String> = self
            .snapshot()
            .iter()
            .map(|(name, n, d)| format!("{name} {n} ({:.1} µs)", d.as_secs_f64() * 1e6 / *n as f64))
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
        for (i, &op) in OPS.iter().enumerate() {
            assert_eq!(op as usize, i, "OPS is in declaration order");
        }
        for _ in 0..3 {
            drop(s.timer(Op::Lookup));
        }
        drop(s.timer(Op::Create));
        let snap = s.snapshot();
        assert_eq!(snap.iter().map(|x| (x.0, x.1)).collect::<Vec<_>>(), vec![("LOOKUP", 3), ("CREATE", 1)]);
        let j = s.json();
        assert!(j.contains("\"requests\":4"), "{j}");
        assert!(j.contains("\"LOOKUP\":{\"count\":3,"), "{j}");
        assert!(s.summary().starts_with("LOOKUP 3 ("), "{}", s.summary());
    }
}
