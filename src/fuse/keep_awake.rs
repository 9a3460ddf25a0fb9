//! Keeping the host's idle CPUs out of halt while requests arrive one at a time.
//!
//! A FUSE request is a ping-pong: the caller sleeps, a queue thread pinned to the
//! caller's CPU answers, and the answer wakes the caller. The scheduler wakes the caller
//! on an *idle* CPU when it finds one (the queue thread is still running where the caller
//! slept), so on two vCPUs the caller hops from CPU to CPU. Where an idle vCPU halts
//! without polling (a VM with `haltpoll.guest_halt_poll_ns=0`), each hop waits ~40 µs
//! for the vCPU to wake, against ~4 µs for the whole round trip when it does not hop
//! (docs/BENCHMARKS.md, "What FUSE costs here").
//!
//! A keeper is a thread per CPU at nice 19 that spins while requests keep coming and
//! sleeps `linger` after the last one. A CPU running it is not idle, so the caller stays
//! where it is, and a task of anyone else's preempts it at once. (SCHED_IDLE would take
//! even less, but the scheduler counts a CPU running only SCHED_IDLE tasks as idle, so
//! the caller would still hop.)
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

    /// A request arrived: keep (or start) spinning.
    pub(crate) fn arrived(&self) {
        let s = &self.shared;
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

/// Nice 19 (a nice-0 task gets ~98% of a CPU it shares with this thread) and pinned.
fn lower_and_pin(cpu: usize) -> io::Result<()> {
    pin(cpu)?;
    let tid = nix::unistd::gettid().as_raw() as libc::id_t;
    // SAFETY: setpriority takes plain integers and touches no memory of ours; on Linux,
    // PRIO_PROCESS with a thread id sets that thread's nice value only.
    if unsafe { libc::setpriority(libc::PRIO_PROCESS, tid, 19) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn keep(s: &Shared) {
    let mut seen = s.arrivals.load(Ordering::SeqCst);
    while !s.stop.load(Ordering::Relaxed) {
        // Spin while requests come. Plain loads, no PAUSE: a hypervisor may take a
        // PAUSE loop for a lock holder's waiter and deschedule the vCPU.
        let mut last = Instant::now();
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
        Some(d) if d.is_zero() => (None, "idle CPUs are left to halt (-o keep_awake_us=0)".into()),
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
        k.arrived();
        wait_parks(2);
        drop(k);
    }
}
