#!/usr/bin/env python3
"""dxfs on an NBD server with added latency (nbdkit's delay filter).

For each per-request delay (default 0, 1 and 5 ms on every read and write; flushes are not
delayed by the filter) this serves a sparse image file with `nbdkit file` behind the delay
filter on a Unix socket, and measures through a real `dxfs mount` of the NBD address:

  create   a create storm: N empty files in one directory, then unmount (commit included)
  ls       cold `ls -l` of those N entries (fresh mount: dxfs's cache is empty), with the
           readdirplus sweep on (default), off (-o noprefetch), and on with one request in
           flight (?inflight=1)
  scan     os.scandir + lstat of the N entries, cold (no sorting, formatting or xattr calls)
  rm       `rm -rf` of the directory, then unmount (commit included)
  write    sequential write of S MiB (dd bs=1M conv=fsync), then unmount
  read     cold sequential read of it (dd bs=1M), default (4 connections where the server
           allows multi-conn, as nbdkit's file plugin does), ?conns=1 and ?inflight=1
  nbdcopy  `nbdcopy --no-extents` of the whole export to null: from the same server, the
           protocol's best case for a sequential read (libnbd, 4 connections x 64 requests)

Each number is one run (wall seconds); the NBD server runs on this machine, so "0 ms" is the
cost of the protocol over a Unix socket plus nbdkit. Needs root (FUSE), nbdkit, nbdcopy
(libnbd-bin) and a release build of dxfs.

    sudo python3 bench/nbd.py --entries 100000 --seq-mib 1024 --delays 0,1,5

`--only seq` runs the write, the reads and nbdcopy alone.
"""

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time


def run(cmd, **kw):
    return subprocess.run(cmd, check=True, **kw)


class Bench:
    def __init__(self, a):
        self.a = a
        self.tmp = tempfile.mkdtemp(prefix="dxfs-nbd-bench-", dir=a.dir)
        self.img = os.path.join(self.tmp, "img")
        self.sock = os.path.join(self.tmp, "nbd.sock")
        self.mnt = os.path.join(self.tmp, "mnt")
        os.mkdir(self.mnt)
        self.server = None
        self.server_log = None
        self.mount_proc = None

    def uri(self, inflight=None, conns=None):
        q = f"socket={self.sock}"
        if inflight:
            q += f"&inflight={inflight}"
        if conns:
            q += f"&conns={conns}"
        return f"nbd+unix:///?{q}"

    def start_server(self, delay_ms):
        self.stop_server()
        if os.path.exists(self.sock):
            os.unlink(self.sock)
        cmd = ["nbdkit", "-f", "-U", self.sock]
        if delay_ms > 0:
            cmd += ["--filter=delay"]
        cmd += ["file", f"file={self.img}"]
        if delay_ms > 0:
            cmd += [f"delay-read={delay_ms}ms", f"delay-write={delay_ms}ms"]
        self.server_log = os.path.join(self.tmp, f"nbdkit-{delay_ms}ms.log")
        cmd.insert(1, "-v")
        self.server = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stderr=open(self.server_log, "w"))
        t0 = time.time()
        while not os.path.exists(self.sock):
            if self.server.poll() is not None:
                sys.exit(f"nbdkit exited: {self.server.returncode}")
            if time.time() - t0 > 20:
                sys.exit("nbdkit did not listen")
            time.sleep(0.01)

    def stop_server(self):
        if self.server is not None:
            self.server.send_signal(signal.SIGTERM)
            try:
                self.server.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.server.kill()
                self.server.wait()
            self.server = None

    def mount(self, opts=None, inflight=None, conns=None):
        cmd = [self.a.dxfs, "mount", self.uri(inflight, conns), self.mnt]
        if opts:
            cmd += ["-o", opts]
        self.mount_proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL)
        t0 = time.time()
        while not os.path.ismount(self.mnt):
            if self.mount_proc.poll() is not None:
                self.fail(f"dxfs mount exited: {self.mount_proc.returncode}")
            if time.time() - t0 > 30:
                sys.exit("not mounted")
            time.sleep(0.01)

    def fail(self, msg):
        if self.server_log:
            keep = os.path.join(self.a.dir, "dxfs-nbd-bench-nbdkit.log")
            shutil.copy(self.server_log, keep)
            msg += f" (nbdkit's log: {keep})"
        sys.exit(msg)

    def unmount(self):
        run(["fusermount3", "-u", self.mnt])
        rc = self.mount_proc.wait(timeout=600)
        self.mount_proc = None
        if rc != 0:
            sys.exit(f"dxfs mount exited {rc}")

    def timed(self, f):
        t0 = time.perf_counter()
        f()
        return round(time.perf_counter() - t0, 3)

    def fsck(self):
        out = subprocess.run([self.a.dxfs, "fsck", "-n", self.uri()], capture_output=True, text=True)
        if out.returncode != 0:
            sys.exit(f"fsck: {out.stdout}{out.stderr}")

    def one_delay(self, d):
        a = self.a
        r = {"delay_ms": d}
        if os.path.exists(self.img):
            os.unlink(self.img)
        size = (a.seq_mib * 5 // 4 + 512) << 20
        with open(self.img, "wb") as f:
            f.truncate(size)
        self.start_server(d)
        run([a.dxfs, "mkfs", "-f", self.uri()], stdout=subprocess.DEVNULL)
        if a.only == "seq":
            r["create_s"] = r["ls_prefetch_s"] = r["ls_noprefetch_s"] = r["ls_inflight1_s"] = None
            r["scan_lstat_s"] = r["rm_rf_s"] = None
        else:
            self.metadata(r)
        big = os.path.join(self.mnt, "big")

        def write():
            self.mount()
            run(["dd", "if=/dev/zero", f"of={big}", "bs=1M", f"count={a.seq_mib}", "conv=fsync", "status=none"])
            self.unmount()

        r["write_s"] = self.timed(write)
        for name, inflight, conns in [("read_s", None, None), ("read_conns1_s", None, 1), ("read_inflight1_s", 1, None)]:
            self.mount(None, inflight, conns)
            r[name] = self.timed(lambda: run(["dd", f"if={big}", "of=/dev/null", "bs=1M", "status=none"]))
            self.unmount()
        r["nbdcopy_s"] = self.timed(lambda: run(["nbdcopy", "--no-extents", self.uri(), "null:"]))
        r["export_mib"] = size >> 20
        r["seq_mib"] = a.seq_mib
        r["read_mib_s"] = round(a.seq_mib / r["read_s"], 1)
        r["read_conns1_mib_s"] = round(a.seq_mib / r["read_conns1_s"], 1)
        r["write_mib_s"] = round(a.seq_mib / r["write_s"], 1)
        r["nbdcopy_mib_s"] = round((size >> 20) / r["nbdcopy_s"], 1)
        self.fsck()
        self.stop_server()
        return r

    def metadata(self, r):
        a = self.a

        def create():
            self.mount()
            dd = os.path.join(self.mnt, "d")
            os.mkdir(dd)
            for i in range(a.entries):
                os.close(os.open(os.path.join(dd, f"file{i:07d}"), os.O_CREAT | os.O_WRONLY, 0o644))
            self.unmount()

        r["create_s"] = self.timed(create)
        for name, opts, inflight in [("ls_prefetch_s", None, None), ("ls_noprefetch_s", "noprefetch", None),
                                     ("ls_inflight1_s", None, 1)]:
            self.mount(opts, inflight)
            dd = os.path.join(self.mnt, "d")
            r[name] = self.timed(lambda: run(["ls", "-l", dd], stdout=subprocess.DEVNULL))
            self.unmount()
        # readdir + lstat of every entry without GNU ls's sorting, formatting and xattr
        # queries (what docs/BENCHMARKS.md's scans measure as `ls -l`).
        self.mount()
        dd = os.path.join(self.mnt, "d")
        r["scan_lstat_s"] = self.timed(lambda: [os.lstat(e.path) for e in os.scandir(dd)])
        self.unmount()

        def rm():
            self.mount()
            shutil.rmtree(os.path.join(self.mnt, "d"))
            self.unmount()

        r["rm_rf_s"] = self.timed(rm)

    def cleanup(self):
        if self.mount_proc is not None:
            subprocess.run(["fusermount3", "-u", "-z", self.mnt])
            try:
                self.mount_proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.mount_proc.kill()
        self.stop_server()
        shutil.rmtree(self.tmp, ignore_errors=True)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--entries", type=int, default=100_000)
    p.add_argument("--seq-mib", type=int, default=1024)
    p.add_argument("--delays", default="0,1,5", help="per-request delays in ms, comma-separated")
    p.add_argument("--dxfs", default="target/release/dxfs")
    p.add_argument("--dir", default="/dev/shm", help="where the image lives")
    p.add_argument("--json", help="also write the results here")
    p.add_argument("--only", choices=["seq"], help="seq: only the sequential write, reads and nbdcopy")
    a = p.parse_args()
    for tool in ["nbdkit", "nbdcopy", "fusermount3", a.dxfs]:
        if shutil.which(tool) is None and not os.path.exists(tool):
            sys.exit(f"{tool} not found")
    b = Bench(a)
    results = []
    try:
        for d in [int(x) for x in a.delays.split(",")]:
            r = b.one_delay(d)
            print(json.dumps(r), flush=True)
            results.append(r)
    finally:
        b.cleanup()
    keys = ["delay_ms", "create_s", "ls_prefetch_s", "ls_noprefetch_s", "ls_inflight1_s", "scan_lstat_s", "rm_rf_s",
            "write_mib_s", "read_mib_s", "read_conns1_mib_s", "read_inflight1_s", "nbdcopy_mib_s"]
    print("| " + " | ".join(keys) + " |")
    print("|" + "---|" * len(keys))
    for r in results:
        print("| " + " | ".join(str(r[k]) for k in keys) + " |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"entries": a.entries, "seq_mib": a.seq_mib, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
