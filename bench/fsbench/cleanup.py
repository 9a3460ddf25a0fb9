"""Guaranteed teardown: every loop device, mount and daemon the runner creates is
registered here and undone in reverse order on normal exit, on error, on Ctrl-C
and on SIGTERM/SIGHUP.
"""

import atexit
import itertools
import os
import signal
import sys
import threading
import time


class Teardown:
    """A stack of undo actions owned by this process (never by forked children)."""

    def __init__(self, log):
        self._log = log
        self._owner = os.getpid()
        self._actions = {}
        self._ids = itertools.count()
        self._lock = threading.RLock()

    def push(self, label, action):
        """Register `action` (a no-argument callable) to undo something; return its token."""
        with self._lock:
            token = next(self._ids)
            self._actions[token] = (label, action)
            return token

    def forget(self, token):
        """The resource was released normally: drop its undo action."""
        with self._lock:
            self._actions.pop(token, None)

    def unwind(self):
        """Run every registered undo action, newest first, whatever happens."""
        if os.getpid() != self._owner:
            return
        previous = _block_stop_signals()
        try:
            while True:
                with self._lock:
                    if not self._actions:
                        break
                    token = max(self._actions)
                    label, action = self._actions.pop(token)
                try:
                    self._log(f"teardown: {label}")
                    action()
                except Exception as e:  # keep unwinding: one failure must not leave the rest
                    self._log(f"teardown: {label} failed: {e}")
        finally:
            _restore_signals(previous)

    def install(self):
        """Make SIGTERM and SIGHUP unwind like Ctrl-C does, and unwind at interpreter exit too."""
        for sig in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, _raise_exit)
        # Even when started in the background, where SIGINT arrives ignored.
        signal.signal(signal.SIGINT, _interrupt)
        atexit.register(self.unwind)


class _State:
    stopping = False  # set once a stop signal arrived: teardown then skips checks and waits briefly


def stopping():
    """True once Ctrl-C, SIGTERM or SIGHUP has been received."""
    return _State.stopping


def _raise_exit(signum, _frame):
    if os.getpid() != _MAIN_PID:
        os._exit(128 + signum)  # a forked workload child: just go
    _State.stopping = True
    raise SystemExit(128 + signum)


def _interrupt(signum, frame):
    if os.getpid() != _MAIN_PID:
        os._exit(128 + signum)
    _State.stopping = True
    raise KeyboardInterrupt


_MAIN_PID = os.getpid()
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _block_stop_signals():
    if threading.current_thread() is not threading.main_thread():
        return None
    return {s: signal.signal(s, signal.SIG_IGN) for s in _STOP_SIGNALS}


def _restore_signals(previous):
    for s, handler in (previous or {}).items():
        signal.signal(s, handler)


class Watchdog:
    """Aborts a hung FUSE connection when a workload overruns its deadline by `grace` seconds.

    A request the daemon never answers blocks the runner in a system call that no
    signal interrupts; aborting the connection (/sys/fs/fuse/connections/N/abort)
    fails that call with ENOTCONN, so the runner can tear down and go on.
    """

    def __init__(self, log, grace=60.0):
        self._log = log
        self._grace = grace
        self._lock = threading.Lock()
        self._deadline = None
        self._abort = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="fsbench-watchdog", daemon=True)

    def start(self):
        self._thread.start()

    def stop(self):
        self._stop.set()

    def arm(self, deadline, abort):
        """Watch until disarmed: past `deadline + grace` (monotonic), call `abort()` once."""
        with self._lock:
            self._deadline, self._abort = deadline, abort

    def disarm(self):
        with self._lock:
            self._deadline, self._abort = None, None

    def _watch(self):
        while not self._stop.wait(1.0):
            with self._lock:
                late = self._deadline is not None and time.monotonic() > self._deadline + self._grace
                abort = self._abort if late else None
                if late:
                    self._deadline, self._abort = None, None
            if abort:
                self._log("watchdog: workload overran its deadline; aborting the FUSE connection")
                try:
                    abort()
                except Exception as e:
                    print(f"watchdog: abort failed: {e}", file=sys.stderr)
