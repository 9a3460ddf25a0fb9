#!/usr/bin/env python3
"""Real applications, side by side: kernel ext4 and dxfs in the same run (issue 15).

    sudo python3 bench/apps.py [--only sqlite,git,cargo] [--size 6] [--transport uring]
                               [--dxfs-opts no_writeback_cache] [--dxfs-bin target/release/dxfs]
                               [--sqlite-rows 100000] [--git-tree /usr/share/doc,/usr/include]
                               [--cargo-src .] [--json FILE]

Each workload gets, per filesystem, a fresh volume of --size GiB on its own loop device
over a sparse file in /dev/shm (bench/loopvol.py), ext4 first, then dxfs:

- sqlite: Python's sqlite3, --sqlite-rows inserts (an integer key, a 16-character
  indexed text, a 100-byte blob) in transactions of 1,000 rows, default synchronous
  (FULL), once with journal_mode=WAL and once with the rollback journal (DELETE). Then,
  with the page cache dropped, `PRAGMA integrity_check` must say ok and every row must
  read back as written (a digest), or the run fails.
- git: `git clone --no-hardlinks file://SRC` into the mount, SRC being a repository
  built once on /dev/shm outside both filesystems from --git-tree (committed, repacked);
  then `git status` (the tree must be clean) once the index is settled (untimed: one
  second later `git update-index --really-refresh` and one `git status`), `git status`
  again after dropping the page cache, and `git fsck` (must succeed; HEAD must match SRC's).
- cargo: `cargo build --release --offline` of dxfs (`git archive HEAD` of --cargo-src
  extracted into the mount, the target directory inside it too), CARGO_BUILD_JOBS=2,
  with a private CARGO_HOME on /dev/shm holding a copy of ~/.cargo/registry (so no lock
  is shared with other cargo processes on the machine); the built binary must run.

After each workload the volume is unmounted and checked (`e2fsck -fn`, `dxfs fsck -n`).
Prints a Markdown table: workload, ext4 seconds, dxfs seconds, dxfs/ext4, the CPU seconds
of the application (user + system) and of the dxfs daemon, and the FUSE requests dxfs
served for it (from the mount's `user.dxfs.stats` counters, through `dxfs stats --json`). A workload
that fails on either filesystem is reported with its error and the exit code is 1.

With `--transport uring` (the default) the fuse module's enable_uring is set to Y for
the whole run and put back to what it was at the end, also on error or SIGTERM. Needs
root, git, cargo, e2fsprogs. The standard library only.
"""
import argparse, hashlib, json, os, platform, random, resource, shutil, signal, sqlite3, subprocess, sys, tempfile, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from loopvol import URING_PARAM, LoopVolume  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
GROUPS = ("sqlite", "git", "cargo")


class Failure(Exception):
    """A workload that did not do what it should (an error, a failed integrity check)."""


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def drop_caches():
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def sh(cmd, vol=None, timeout=3600, cwd=None, env=None, stdin=None):
    """Run `cmd` in its own session; fail with its stderr. On timeout the process group
    (started here) is killed and, if it hangs on the mount, the FUSE connection aborted."""
    p = subprocess.Popen(cmd, cwd=cwd, env=env, stdin=stdin, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except BaseException as e:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            p.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            if vol is not None:
                log("process stuck on the mount: aborting the FUSE connection")
                vol.abort()
            p.communicate()
        if isinstance(e, subprocess.TimeoutExpired):
            raise Failure(f"{' '.join(cmd)}: timed out after {timeout} s") from None
        raise
    if p.returncode != 0:
        tail = "\n".join((err or out).strip().splitlines()[-15:])
        raise Failure(f"{' '.join(cmd)}: exit {p.returncode}:\n{tail}")
    return out


def daemon_cpu(vol):
    """CPU seconds (user + system, all threads) of the dxfs daemon so far; 0 for ext4."""
    if vol.daemon is None:
        return 0.0
    try:
        f = open(f"/proc/{vol.daemon.pid}/stat").read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def foreign_builds():
    """rustc/cc/ld/cargo processes on the machine: called when none of ours run, so they are
    someone else's (another engineer building)."""
    n = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            comm = open(f"/proc/{pid}/comm").read().strip()
        except OSError:
            continue
        if comm in ("rustc", "cc1", "cc1plus", "ld", "cargo", "ld.lld", "cc"):
            n += 1
    return n


class Bench:
    def __init__(self, a, work):
        self.a, self.work = a, work
        self.dxfs = os.path.abspath(a.dxfs_bin)
        self.rows = []  # one dict per workload and filesystem (see timed() and failed())
        self.fsck = []
        self.transport_seen = set()
        self._git_src = None
        self._cargo_home = None

    # -- measurement --------------------------------------------------------------------------
    def timed(self, vol, fs, group, label, fn):
        before = vol.stats() if fs == "dxfs" else {}
        foreign = foreign_builds()
        load0 = os.getloadavg()[0]
        ru0, d0 = resource.getrusage(resource.RUSAGE_CHILDREN), daemon_cpu(vol)
        t0 = time.monotonic()
        inner = fn()
        dt = time.monotonic() - t0
        ru1, d1 = resource.getrusage(resource.RUSAGE_CHILDREN), daemon_cpu(vol)
        if isinstance(inner, float):
            dt = inner  # the child's own timing (without its interpreter start-up)
        row = {"group": group, "workload": label, "fs": fs, "seconds": dt, "load_before": load0,
               "load_after": os.getloadavg()[0], "foreign_build_procs": foreign,
               # CPU time of the application (user, system), and of the dxfs daemon: less
               # disturbed than wall time by other work on the machine. (For SQLite it
               # includes the child's start-up and data generation, about 0.1 s.)
               "app_user_s": ru1.ru_utime - ru0.ru_utime, "app_sys_s": ru1.ru_stime - ru0.ru_stime,
               "daemon_cpu_s": d1 - d0}
        if fs == "dxfs":
            after = vol.stats()
            self.transport_seen.add(f"{after.get('transport', '?')}")
            ops, ops_us = {}, {}
            for name, o in after.get("ops", {}).items():
                b = before.get("ops", {}).get(name, {})
                c = o.get("count", 0) - b.get("count", 0)
                if c:
                    ops[name] = c
                    ops_us[name] = round(o.get("total_us", 0) - b.get("total_us", 0))
            row["requests"] = sum(ops.values())
            row["ops"] = ops
            row["ops_total_us"] = ops_us
            row["via_ring"] = after.get("via_ring", 0) - before.get("via_ring", 0)
        self.rows.append(row)
        log(f"{fs}: {label}: {dt:.2f} s" + (f", {row['requests']:,} FUSE requests" if fs == "dxfs" else ""))

    def wait_quiet(self):
        """Wait up to --quiet-wait seconds for other build processes on the machine to end."""
        end = time.monotonic() + self.a.quiet_wait
        n = foreign_builds()
        if n and self.a.quiet_wait:
            log(f"{n} other build processes running: waiting up to {self.a.quiet_wait} s for them to end")
            while n and time.monotonic() < end:
                time.sleep(2)
                n = foreign_builds()

    def failed(self, group, fs, err):
        self.rows.append({"group": group, "workload": group, "fs": fs, "error": str(err)})
        log(f"{fs}: {group} FAILED: {err}")

    def volume(self, fs, group):
        opts = []
        for o in filter(None, self.a.dxfs_opts.split(",")):
            opts += ["-o", o]
        dlog = os.path.join(self.work, f"dxfs-{group}.log")
        return LoopVolume(fs, self.a.size, self.dxfs, self.a.transport, opts, log=dlog, fsck=True)

    def run_group(self, group):
        for fs in ("ext4", "dxfs"):
            self.wait_quiet()
            vol = self.volume(fs, group)
            try:
                with vol:
                    getattr(self, f"g_{group}")(vol, fs)
            except Failure as e:
                self.failed(group, fs, e)
                if fs == "dxfs":
                    self.daemon_log_tail(group)
            except Exception as e:  # noqa: BLE001 — an OSError from the mount is a finding too
                self.failed(group, fs, f"{type(e).__name__}: {e}")
                if fs == "dxfs":
                    self.daemon_log_tail(group)
            if vol.fsck_result is not None:
                rc, out = vol.fsck_result
                self.fsck.append({"group": group, "fs": fs, "rc": rc, "output": out[-4000:]})
                if rc != 0:
                    self.failed(group, fs, f"fsck after {group} exit {rc}:\n{out[-2000:]}")
                else:
                    log(f"{fs}: fsck after {group}: clean")

    def daemon_log_tail(self, group):
        p = os.path.join(self.work, f"dxfs-{group}.log")
        if os.path.exists(p):
            tail = open(p, errors="replace").read()[-3000:]
            if tail.strip():
                log(f"dxfs daemon log ({p}), last lines:\n{tail}")

    # -- sqlite -------------------------------------------------------------------------------
    def g_sqlite(self, vol, fs):
        for mode in ("wal", "delete"):
            d = os.path.join(vol.mnt, f"sqlite-{mode}")
            os.mkdir(d)
            db = os.path.join(d, "bench.db")
            child = [sys.executable, os.path.abspath(__file__), "--sqlite-child"]
            args = [db, mode, str(self.a.sqlite_rows), str(self.a.sqlite_batch)]
            res = {}

            def insert():
                res.update(json.loads(sh(child + ["insert"] + args, vol, self.a.timeout)))
                return float(res["seconds"])
            label = f"sqlite {self.a.sqlite_rows:,} inserts, {self.a.sqlite_batch:,}/txn, {mode.upper()}"
            self.timed(vol, fs, "sqlite", label, insert)
            drop_caches()
            chk = json.loads(sh(child + ["check"] + args, vol, self.a.timeout))
            if chk["integrity"] != ["ok"]:
                raise Failure(f"{mode}: PRAGMA integrity_check: {chk['integrity'][:20]}")
            if chk["count"] != self.a.sqlite_rows or chk["digest"] != res["digest"]:
                raise Failure(f"{mode}: rows read back differ: {chk['count']} rows, digest {chk['digest']} "
                              f"(wrote {self.a.sqlite_rows}, {res['digest']})")
            log(f"{fs}: sqlite {mode}: journal_mode={res['journal_mode']} synchronous={res['synchronous']}; "
                f"integrity_check ok, {chk['count']:,} rows read back cold")

    # -- git ----------------------------------------------------------------------------------
    def git_env(self):
        env = dict(os.environ, GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL="/dev/null",
                   GIT_AUTHOR_NAME="bench", GIT_AUTHOR_EMAIL="bench@example.invalid",
                   GIT_COMMITTER_NAME="bench", GIT_COMMITTER_EMAIL="bench@example.invalid",
                   GIT_AUTHOR_DATE="2026-01-01T00:00:00Z", GIT_COMMITTER_DATE="2026-01-01T00:00:00Z")
        return env

    def git_src(self):
        if self._git_src:
            return self._git_src
        src = os.path.join(self.work, "git-src")
        env = self.git_env()
        t0 = time.monotonic()
        os.mkdir(src)
        sh(["git", "init", "-q", src], env=env)
        for d in filter(None, self.a.git_tree.split(",")):
            dst = os.path.join(src, d.strip("/").replace("/", "_"))
            sh(["cp", "-a", d, dst])
        # Nested repositories or .gitignore files in the copied trees would hide files.
        for dirpath, dirnames, filenames in os.walk(src):
            if dirpath == src:
                dirnames[:] = [n for n in dirnames if n != ".git"]
                continue
            for n in list(dirnames):
                if n == ".git":
                    shutil.rmtree(os.path.join(dirpath, n))
                    dirnames.remove(n)
            if ".gitignore" in filenames:
                os.unlink(os.path.join(dirpath, ".gitignore"))
        sh(["git", "-C", src, "add", "-A"], env=env)
        sh(["git", "-C", src, "commit", "-q", "-m", "bench tree"], env=env)
        sh(["git", "-C", src, "repack", "-a", "-d", "-q"], env=env)
        files = int(sh(["git", "-C", src, "ls-files", "-z"], env=env).count("\0"))
        size = int(sh(["du", "-sb", "--exclude=.git", src]).split()[0])
        pack = int(sh(["du", "-sb", os.path.join(src, ".git")]).split()[0])
        self.git_info = {"files": files, "tree_bytes": size, "git_dir_bytes": pack, "from": self.a.git_tree}
        log(f"git source: {files:,} files, {size / 2**20:.0f} MiB, .git {pack / 2**20:.0f} MiB "
            f"(built in {time.monotonic() - t0:.0f} s)")
        self._git_src = src
        return src

    def g_git(self, vol, fs):
        src, env = self.git_src(), self.git_env()
        clone = os.path.join(vol.mnt, "clone")
        t = self.a.timeout
        self.timed(vol, fs, "git", "git clone --no-hardlinks",
                   lambda: sh(["git", "clone", "-q", "--no-hardlinks", f"file://{src}", clone], vol, t, env=env))
        # Files written in the same second as the index are "racily clean": every status
        # hashes them again until the index is rewritten later. How many there are depends
        # on how fast the clone was, so settle the index first (untimed), as a second
        # status would: one second later, refresh and rewrite it.
        # The refresh reads those files again, which makes the kernel ask for their
        # attributes once more (FUSE drops a file's cached atime after a read), so one
        # untimed status first: the timed one is a repeated status in a settled tree.
        time.sleep(1.1)
        sh(["git", "-C", clone, "update-index", "-q", "--really-refresh"], vol, t, env=env)
        sh(["git", "-C", clone, "status", "--porcelain"], vol, t, env=env)

        def status():
            out = sh(["git", "-C", clone, "status", "--porcelain"], vol, t, env=env)
            if out.strip():
                raise Failure(f"git status: the fresh clone is not clean:\n{out[:2000]}")
        self.timed(vol, fs, "git", "git status, warm (index settled)", status)
        drop_caches()
        self.timed(vol, fs, "git", "git status, page cache dropped", status)
        fsck_out = []
        self.timed(vol, fs, "git", "git fsck",
                   lambda: fsck_out.append(sh(["git", "-C", clone, "fsck", "--no-progress"], vol, t, env=env)))
        head = sh(["git", "-C", clone, "rev-parse", "HEAD"], env=env).strip()
        want = sh(["git", "-C", src, "rev-parse", "HEAD"], env=env).strip()
        if head != want:
            raise Failure(f"clone HEAD {head} != source HEAD {want}")
        log(f"{fs}: git fsck ok, tree clean, HEAD {head[:12]}")

    # -- cargo --------------------------------------------------------------------------------
    def cargo_home(self):
        if self._cargo_home:
            return self._cargo_home
        home = os.path.join(self.work, "cargo-home")
        os.mkdir(home)
        real = os.environ.get("CARGO_HOME") or os.path.expanduser("~/.cargo")
        shutil.copytree(os.path.join(real, "registry"), os.path.join(home, "registry"), symlinks=True)
        for name in ("config.toml", "config"):
            if os.path.exists(os.path.join(real, name)):
                shutil.copy2(os.path.join(real, name), os.path.join(home, name))
        self._cargo_home = home
        return home

    def g_cargo(self, vol, fs):
        home = self.cargo_home()
        src = os.path.join(vol.mnt, "src")
        os.mkdir(src)
        commit = sh(["git", "-C", self.a.cargo_src, "rev-parse", "HEAD"]).strip()
        arch = subprocess.Popen(["git", "-C", self.a.cargo_src, "archive", commit], stdout=subprocess.PIPE)
        try:
            sh(["tar", "-x", "-C", src], vol, self.a.timeout, stdin=arch.stdout)
        finally:
            arch.stdout.close()
            if arch.wait() != 0:
                raise Failure(f"git archive {commit} exit {arch.returncode}")
        self.cargo_commit = commit
        env = {k: v for k, v in os.environ.items() if not k.startswith(("CARGO_", "RUSTC_WRAPPER"))}
        env.update(CARGO_HOME=home, CARGO_BUILD_JOBS=str(self.a.cargo_jobs))
        # Warm the toolchain into the page cache (it lives outside both volumes), so the
        # first build does not pay for reading rustc's libraries from the root disk.
        sysroot = sh(["rustc", "--print", "sysroot"], env=env).strip()
        for dirpath, _, files in os.walk(os.path.join(sysroot, "lib")):
            for f in files:
                p = os.path.join(dirpath, f)
                if os.path.isfile(p) and not os.path.islink(p):
                    with open(p, "rb") as fh:
                        while fh.read(1 << 20):
                            pass
        self.timed(vol, fs, "cargo", f"cargo build --release ({self.a.cargo_jobs} jobs)",
                   lambda: sh(["cargo", "build", "--release", "--offline"], vol, self.a.timeout, cwd=src, env=env))
        ver = sh([os.path.join(src, "target", "release", "dxfs"), "--version"], vol, 60).strip()
        log(f"{fs}: the built binary runs from the mount: {ver}")

    # -- report -------------------------------------------------------------------------------
    def table(self):
        out = ["| workload | ext4 s | dxfs s | dxfs/ext4 | ≤ 1.3× | CPU s ext4 | CPU s dxfs + daemon "
               "| dxfs FUSE requests (largest kinds) |",
               "|---|---|---|---|---|---|---|---|"]
        labels = []
        for r in self.rows:
            if r["workload"] not in labels:
                labels.append(r["workload"])
        for label in labels:
            e = next((r for r in self.rows if r["workload"] == label and r["fs"] == "ext4"), None)
            d = next((r for r in self.rows if r["workload"] == label and r["fs"] == "dxfs"), None)

            def cell(r):
                if r is None:
                    return "—"
                return "**failed**" if "error" in r else (f"{r['seconds']:.3f}" if r["seconds"] < 1 else f"{r['seconds']:.2f}")
            ratio = met = req = ""
            if e and d and "error" not in e and "error" not in d and e["seconds"] > 0:
                x = d["seconds"] / e["seconds"]
                ratio, met = f"{x:.2f}×", "yes" if x <= 1.3 else "**no**"
            if d and "ops" in d:
                top = sorted(d["ops"].items(), key=lambda kv: -kv[1])[:4]
                req = f"{d['requests']:,} (" + ", ".join(f"{k} {v:,}" for k, v in top) + ")"
            def cpu(r, daemon):
                if r is None or "error" in r:
                    return ""
                c = f"{r['app_user_s'] + r['app_sys_s']:.2f}"
                return c + (f" + {r['daemon_cpu_s']:.2f}" if daemon else "")
            out.append(f"| {label} | {cell(e)} | {cell(d)} | {ratio} | {met} | {cpu(e, False)} | {cpu(d, True)} "
                       f"| {req} |")
        return "\n".join(out)


def sqlite_child(argv):
    """In a child process (so a hung mount cannot hang the runner): `insert` or `check`."""
    what, db, mode, rows, batch = argv[0], argv[1], argv[2], int(argv[3]), int(argv[4])
    rng = random.Random(15)
    data = [(f"{rng.getrandbits(64):016x}", rng.randbytes(100)) for _ in range(rows)]
    digest = hashlib.sha256()
    for i, (k, v) in enumerate(data, 1):
        digest.update(f"{i}:{k}:".encode() + v)
    if what == "insert":
        t0 = time.monotonic()
        con = sqlite3.connect(db, isolation_level=None)
        jm = con.execute(f"PRAGMA journal_mode={mode}").fetchone()[0]
        if jm.lower() != mode:
            raise SystemExit(f"journal_mode={mode} refused: the database is in {jm}")
        sync = con.execute("PRAGMA synchronous").fetchone()[0]
        con.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, k TEXT NOT NULL, v BLOB NOT NULL)")
        con.execute("CREATE INDEX t_k ON t(k)")
        for b in range(0, rows, batch):
            con.execute("BEGIN")
            con.executemany("INSERT INTO t(k, v) VALUES (?, ?)", data[b:b + batch])
            con.execute("COMMIT")
        con.close()
        print(json.dumps({"seconds": time.monotonic() - t0, "journal_mode": jm, "synchronous": sync,
                          "digest": digest.hexdigest()}))
    else:
        con = sqlite3.connect(db, isolation_level=None)
        integ = [r[0] for r in con.execute("PRAGMA integrity_check")]
        got = hashlib.sha256()
        n = 0
        for i, k, v in con.execute("SELECT id, k, v FROM t ORDER BY id"):
            got.update(f"{i}:{k}:".encode() + v)
            n += 1
        con.close()
        print(json.dumps({"integrity": integ, "count": n, "digest": got.hexdigest()}))


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--sqlite-child":
        return sqlite_child(sys.argv[2:])
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default=",".join(GROUPS), help="comma-separated: sqlite,git,cargo")
    ap.add_argument("--size", type=int, default=6, help="GiB per volume (default 6)")
    ap.add_argument("--transport", default="uring", help="dxfs -o transport= (default uring)")
    ap.add_argument("--dxfs-opts", default="", help="extra dxfs mount options, comma-separated "
                    "(e.g. writeback_cache or no_writeback_cache)")
    ap.add_argument("--dxfs-bin", default=os.path.join(ROOT, "target", "release", "dxfs"))
    ap.add_argument("--sqlite-rows", type=int, default=100_000)
    ap.add_argument("--sqlite-batch", type=int, default=1_000)
    ap.add_argument("--git-tree", default="/usr/share/doc,/usr/include",
                    help="directories copied into the source repository (default /usr/share/doc,/usr/include)")
    ap.add_argument("--cargo-src", default=ROOT, help="repository whose HEAD is built (default: this one)")
    ap.add_argument("--cargo-jobs", type=int, default=2)
    ap.add_argument("--timeout", type=int, default=3600, help="seconds any one command may take")
    ap.add_argument("--quiet-wait", type=int, default=0,
                    help="before each volume, wait up to this many seconds for other build processes "
                    "(rustc, cc, ld, cargo) on the machine to end (default 0: do not wait)")
    ap.add_argument("--json", help="write the results here too")
    a = ap.parse_args()
    groups = [g for g in a.only.split(",") if g]
    bad = [g for g in groups if g not in GROUPS]
    if bad:
        ap.error(f"unknown workloads {bad}; choose from {GROUPS}")
    if os.geteuid() != 0:
        ap.error("needs root (loop devices, mount, drop_caches)")
    if not os.access(a.dxfs_bin, os.X_OK):
        ap.error(f"{a.dxfs_bin}: no dxfs binary (cargo build --release, or --dxfs-bin)")

    def stop(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")
    for s in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, stop)

    old_param = None
    work = tempfile.mkdtemp(dir="/dev/shm", prefix="dxfs-apps-")
    b = Bench(a, work)
    start = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    load_start = os.getloadavg()
    try:
        if a.transport == "uring" and os.path.exists(URING_PARAM):
            old_param = open(URING_PARAM).read().strip()
            with open(URING_PARAM, "w") as f:
                f.write("Y\n")
        for g in groups:
            b.run_group(g)
    finally:
        if old_param is not None:
            with open(URING_PARAM, "w") as f:
                f.write(old_param + "\n")
        shutil.rmtree(work, ignore_errors=True)

    load_end = os.getloadavg()
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    head = (f"{start}, Linux {platform.release()}, {os.cpu_count()} vCPUs ({cpu}); loop devices over /dev/shm, "
            f"{a.size} GiB volumes; dxfs -o transport={a.transport}"
            + (f",{a.dxfs_opts}" if a.dxfs_opts else "")
            + f" (served by: {', '.join(sorted(b.transport_seen)) or '?'}); load average "
            f"{load_start[0]:.2f} / {load_start[1]:.2f} / {load_start[2]:.2f} at the start, "
            f"{load_end[0]:.2f} / {load_end[1]:.2f} / {load_end[2]:.2f} at the end")
    print(head + "\n")
    print(b.table())
    errors = [r for r in b.rows if "error" in r]
    if errors:
        print("\nFailures:")
        for r in errors:
            print(f"- {r['fs']}, {r['group']}: {r['error']}")
    busy = sorted({r["workload"] for r in b.rows if r.get("foreign_build_procs")})
    if busy:
        print(f"\nOther build processes (rustc, cc, ld, cargo) were running on the machine when these started: "
              f"{'; '.join(busy)}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"header": head, "args": vars(a), "rows": b.rows, "fsck": b.fsck,
                       "git": getattr(b, "git_info", None), "cargo_commit": getattr(b, "cargo_commit", None)},
                      f, indent=1)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
