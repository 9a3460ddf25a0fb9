//! Keeping the host's idle CPUs out of halt while requests arrive one at a time
//! (`-o keep_awake_us`, off by default).
//!
//! A FUSE request is a ping-pong: the caller sleeps, a queue thread pinned to the
//! caller's CPU answers, and the answer wakes the caller. The scheduler wakes the caller
//! on an *idle* CPU when it finds one (the queue thread is still running where the caller
//! slept), so on two vCPUs the caller hops from CPU to CPU. Where an idle vCPU halts
//! without polling (a VM with `haltpoll.guest_halt_poll_ns=0`), each hop waits ~40 µs
//! for the vCPU to wake, against ~5 µs for the whole round trip when it does not hop.
//!
//! A keeper is a thread per CPU at nice 19 with the shortest slice that spins while
//! requests keep coming and sleeps `linger` after the last one. A CPU running it is not
//! idle, so the caller stays where it is. (SCHED_IDLE would not do: the scheduler counts
//! a CPU running only SCHED_IDLE tasks as idle.) The price, and why it is off by default:
//! a busy CPU is hidden from the scheduler for *every* wake-up, so work it would have
//! spread onto the idle CPU (the kernel's flusher, a commit, an application's second
//! thread) stacks up where it woke; and across scheduler groups (autogroups, cgroups)
//! nice 19 counts for nothing. So a keeper leaves a CPU whose other work made it wait
//! half of a 200 µs window, and all keepers stand down after written-back pages and
//! syncs (docs/BENCHMARKS.md, "Keepers").
#![allow(unsafe_code)]

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The keepers of one session; dropping it stops them.
pub(crate) struct Keepers {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
}

struct Shared {
    /// Requests seen so far: a keeper spins while this moves.
    arrivals: AtomicU64,
    /// Keepers asleep: a request wakes them when this is not zero.
    parked: AtomicUsize,
    /// Times a keeper went to sleep.
    parks: AtomicU64,
    /// Times a keeper left a CPU that had other work.
    backoffs: AtomicU64,
    /// Keepers sleep until then (ns after `epoch`).
    stand_down_until: AtomicU64,
    epoch: Instant,
    stop: AtomicBool,
    /// Bumped to wake the parked keepers.
    wakes: Mutex<u64>,
    woken: Condvar,
    linger: Duration,
}

impl Keepers {
    /// One keeper pinned to each CPU of `cpus`, spinning until `linger` after the last
    /// request.
    pub(crate) fn start(cpus: &[usize], linger: Duration) -> io::Result<Keepers> {
        let shared = Arc::new(Shared {
            arrivals: AtomicU64::new(0),
            parked: AtomicUsize::new(0),
            parks: AtomicU64::new(0),
            backoffs: AtomicU64::new(0),
            stand_down_until: AtomicU64::new(0),
            epoch: Instant::now(),
            stop: AtomicBool::new(false),
            wakes: Mutex::new(0),
            woken: Condvar::new(),
            linger,
        });
        let mut keepers = Keepers { shared: shared.clone(), threads: Vec::new() };
        for &cpu in cpus {
            let shared = shared.clone();
            let t = std::thread::Builder::new().name(format!("dxfs-keep-{cpu}")).spawn(move || {
                if let Err(e) = lower_and_pin(cpu) {
                    tracing::debug!("keeper for CPU {cpu}: {e}; not started");
                    return;
                }
                keep(&shared);
            })?;
            keepers.threads.push(t);
        }
        Ok(keepers)
    }

    /// A request arrived: keep (or start) spinning; stand down for a while after one
    /// that starts work beside the request-reply (see [`stands_down`]).
    pub(crate) fn arrived(&self, opcode: u32) {
        let s = &self.shared;
        if stands_down(opcode) {
            let until = s.epoch.elapsed().saturating_add(BACKOFF).as_nanos() as u64;
            s.stand_down_until.fetch_max(until, Ordering::Relaxed);
        }
        // SeqCst on both sides: a keeper going to sleep either sees this arrival or is
        // seen parked here (see `keep`).
        s.arrivals.fetch_add(1, Ordering::SeqCst);
        if s.parked.load(Ordering::SeqCst) != 0 {
            let mut w = s.wakes.lock().unwrap_or_else(|p| p.into_inner());
            *w = w.wrapping_add(1);
            s.woken.notify_all();
        }
    }
}

impl Drop for Keepers {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        {
            let mut w = self.shared.wakes.lock().unwrap_or_else(|p| p.into_inner());
            *w = w.wrapping_add(1);
            self.shared.woken.notify_all();
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// The kernel's `struct sched_attr` (`include/uapi/linux/sched/types.h`, VER1: 56 bytes).
#[repr(C)]
struct SchedAttr {
    size: u32,
    policy: u32,
    flags: u64,
    nice: i32,
    priority: u32,
    runtime: u64,
    deadline: u64,
    period: u64,
    util_min: u32,
    util_max: u32,
}

/// The shortest slice the scheduler takes (`sched_runtime` of a fair task: 0.1 ms).
const SHORT_SLICE_NS: u64 = 100_000;

/// Pinned, nice 19 (a nice-0 task gets ~98% of a CPU it shares with this thread) and
/// with the shortest slice: a freshly picked task may keep its CPU for a slice before a
/// woken one preempts it (EEVDF's RUN_TO_PARITY), and the default slice is ~1 ms.
fn lower_and_pin(cpu: usize) -> io::Result<()> {
    pin(cpu)?;
    let attr = SchedAttr {
        size: std::mem::size_of::<SchedAttr>() as u32,
        policy: libc::SCHED_OTHER as u32,
        flags: 0,
        nice: 19,
        priority: 0,
        runtime: SHORT_SLICE_NS,
        deadline: 0,
        period: 0,
        util_min: 0,
        util_max: 0,
    };
    // SAFETY: sched_setattr reads `attr.size` bytes from a live, initialised struct of
    // exactly that size and writes nothing; pid 0 is this thread.
    if unsafe { libc::syscall(libc::SYS_sched_setattr, 0, &attr as *const SchedAttr, 0) } == 0 {
        return Ok(());
    }
    // Kernels before 3.14 lack sched_setattr: nice alone.
    let tid = nix::unistd::gettid().as_raw() as libc::id_t;
    // SAFETY: setpriority takes plain integers and touches no memory of ours; on Linux,
    // PRIO_PROCESS with a thread id sets that thread's nice value only.
    if unsafe { libc::setpriority(libc::PRIO_PROCESS, tid, 19) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Requests that start work beside the request-reply: written-back pages (the kernel's
/// flusher sends them while the writer computes), and syncs (a commit on other threads).
/// A busy CPU is one the scheduler will not place that work on, so keepers then leave
/// the CPUs idle (measured: SQLite's inserts 1.4× slower with keepers spinning through).
fn stands_down(opcode: u32) -> bool {
    use super::wire::opcode::{FSYNC, FSYNCDIR, SYNCFS, WRITE};
    matches!(opcode, WRITE | FSYNC | FSYNCDIR | SYNCFS)
}

/// How often a keeper checks whether its CPU has other work.
const WINDOW: Duration = Duration::from_micros(200);
/// How long a keeper leaves a CPU that has other work before it tries again.
const BACKOFF: Duration = Duration::from_millis(20);

/// This thread's time spent waiting for a CPU (`run_delay` in
/// `/proc/thread-self/schedstat`), in ns.
struct RunDelay(std::fs::File);

impl RunDelay {
    fn open() -> io::Result<RunDelay> {
        let f = std::fs::File::open("/proc/thread-self/schedstat")?;
        let r = RunDelay(f);
        r.read().ok_or_else(|| io::Error::other("/proc/thread-self/schedstat unreadable"))?;
        Ok(r)
    }

    fn read(&self) -> Option<u64> {
        use std::os::unix::fs::FileExt;
        let mut buf = [0u8; 96];
        let n = self.0.read_at(&mut buf, 0).ok()?;
        std::str::from_utf8(&buf[..n]).ok()?.split_ascii_whitespace().nth(1)?.parse().ok()
    }
}

fn keep(s: &Shared) {
    // A keeper that cannot tell when its CPU has other work does not spin.
    let delay = match RunDelay::open() {
        Ok(d) => d,
        Err(e) => {
            tracing::debug!("keeper: {e}; not started");
            return;
        }
    };
    let mut seen = s.arrivals.load(Ordering::SeqCst);
    while !s.stop.load(Ordering::Relaxed) {
        // Spin while requests come. Plain loads, no PAUSE: a hypervisor may take a
        // PAUSE loop for a lock holder's waiter and deschedule the vCPU.
        let mut last = Instant::now();
        let (mut window, mut waited) = (last, delay.read().unwrap_or(0));
        loop {
            for _ in 0..512 {
                std::hint::black_box(s.arrivals.load(Ordering::Relaxed));
            }
            if s.stop.load(Ordering::Relaxed) {
                return;
            }
            let now = s.arrivals.load(Ordering::Relaxed);
            if now != seen {
                seen = now;
                last = Instant::now();
            } else if last.elapsed() >= s.linger {
                break;
            }
            let spent = window.elapsed();
            if spent >= WINDOW {
                // Waiting to run for half the window means the CPU has other work (a task
                // of another group of the scheduler's, where nice 19 counts for nothing).
                let w = delay.read().unwrap_or(waited);
                let contended = w.saturating_sub(waited) as u128 * 2 > spent.as_nanos();
                let until = Duration::from_nanos(s.stand_down_until.load(Ordering::Relaxed));
                let pause = if contended { BACKOFF } else { until.saturating_sub(s.epoch.elapsed()) };
                if !pause.is_zero() {
                    s.backoffs.fetch_add(1, Ordering::Relaxed);
                    let g = s.wakes.lock().unwrap_or_else(|p| p.into_inner());
                    if !s.stop.load(Ordering::Relaxed) {
                        let _ = s.woken.wait_timeout(g, pause);
                    }
                    last = Instant::now();
                }
                (window, waited) = (Instant::now(), delay.read().unwrap_or(w));
            }
        }
        // Sleep until the next request.
        let mut w = s.wakes.lock().unwrap_or_else(|p| p.into_inner());
        s.parked.fetch_add(1, Ordering::SeqCst);
        s.parks.fetch_add(1, Ordering::Relaxed);
        let before = *w;
        if s.arrivals.load(Ordering::SeqCst) == seen {
            while *w == before && !s.stop.load(Ordering::Relaxed) {
                w = s.woken.wait(w).unwrap_or_else(|p| p.into_inner());
            }
        }
        s.parked.fetch_sub(1, Ordering::SeqCst);
        drop(w);
        seen = s.arrivals.load(Ordering::SeqCst);
    }
}

/// Hosts with more CPUs than this get no keepers unless asked: spinning on every idle
/// CPU of a big host costs too much, and there the scheduler scans few of them anyway.
const AUTO_MAX_CPUS: usize = 4;
/// A wake-up slower than this means idle CPUs halt without polling.
const SLOW_WAKE: Duration = Duration::from_micros(20);
/// How long keepers spin after the last request when the mount decides.
const AUTO_LINGER: Duration = Duration::from_millis(1);

/// The keepers' linger for this mount, or `None` for no keepers, and what to log.
/// `choice` is `-o keep_awake_us` (`None`: auto, decided by measuring the host).
pub(crate) fn decide(choice: Option<Duration>) -> (Option<Duration>, String) {
    let cpus = allowed_cpus();
    match choice {
        Some(d) if d.is_zero() => (None, "no keepers (-o keep_awake_us=auto|N starts them)".into()),
        _ if cpus.len() < 2 => (None, "one CPU: no keepers".into()),
        Some(d) => (Some(d), format!("keeping idle CPUs awake until {d:?} after each request (-o keep_awake_us)")),
        None if cpus.len() > AUTO_MAX_CPUS => {
            (None, format!("{} CPUs: idle CPUs are left to halt (-o keep_awake_us=N keeps them awake)", cpus.len()))
        }
        None => match idle_wake_latency(cpus[0], cpus[1]) {
            Some(lat) if lat >= SLOW_WAKE => (
                Some(AUTO_LINGER),
                format!(
                    "an idle CPU takes {lat:?} to wake on this host: keeping idle CPUs awake at nice 19 \
                     until {AUTO_LINGER:?} after each request (-o keep_awake_us=0 turns this off)"
                ),
            ),
            Some(lat) => (None, format!("an idle CPU takes {lat:?} to wake on this host: no keepers needed")),
            None => (None, "could not measure how fast idle CPUs wake: no keepers".into()),
        },
    }
}

/// The CPUs this process may run on.
pub(crate) fn allowed_cpus() -> Vec<usize> {
    match nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0)) {
        Ok(set) => (0..nix::sched::CpuSet::count()).filter(|&c| set.is_set(c).unwrap_or(false)).collect(),
        Err(_) => Vec::new(),
    }
}

/// How long this host takes to wake a thread on an idle CPU: the median of a few
/// wake-ups from `from` to `to`, each after both CPUs idled for 300 µs. `None` if the
/// threads cannot be pinned.
pub(crate) fn idle_wake_latency(from: usize, to: usize) -> Option<Duration> {
    const ROUNDS: usize = 15;
    let (tx, rx) = std::sync::mpsc::channel::<Instant>();
    let waiter = std::thread::Builder::new()
        .name("dxfs-wake-probe".into())
        .spawn(move || -> Option<Vec<Duration>> {
            pin(to).ok()?;
            Some(rx.iter().map(|sent| sent.elapsed()).collect())
        })
        .ok()?;
    let sender = std::thread::Builder::new()
        .name("dxfs-wake-probe".into())
        .spawn(move || {
            if pin(from).is_err() {
                return;
            }
            for _ in 0..ROUNDS {
                std::thread::sleep(Duration::from_micros(300));
                if tx.send(Instant::now()).is_err() {
                    return;
                }
            }
        })
        .ok()?;
    let _ = sender.join();
    let mut lat = waiter.join().ok()??;
    if lat.len() < ROUNDS {
        return None;
    }
    lat.sort();
    Some(lat[lat.len() / 2])
}

fn pin(cpu: usize) -> io::Result<()> {
    let mut set = nix::sched::CpuSet::new();
    set.set(cpu).map_err(io::Error::other)?;
    nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set).map_err(io::Error::other)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A keeper sleeps once requests stop, wakes for the next one (and sleeps again
    /// after its linger), and ends when the keepers are dropped.
    #[test]
    fn keepers_sleep_wake_and_stop() {
        let k = Keepers::start(&[0], Duration::from_millis(2)).unwrap();
        let wait_parks = |n: u64| {
            let t = Instant::now();
            while k.shared.parks.load(Ordering::Relaxed) < n || k.shared.parked.load(Ordering::SeqCst) != 1 {
                assert!(t.elapsed() < Duration::from_secs(10), "the keeper never went to sleep a {n}th time");
                std::thread::sleep(Duration::from_millis(1));
            }
        };
        wait_parks(1);
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(k.shared.parks.load(Ordering::Relaxed), 1, "woke without a request");
        k.arrived(super::super::wire::opcode::GETATTR);
        wait_parks(2);
        drop(k);
    }
}
