"""Ratios, Markdown tables, PNG plots, and the generated section of docs/BENCHMARKS.md."""

import os

BEGIN = "<!-- bench:begin -->"
END = "<!-- bench:end -->"
REFERENCES = ("ext4", "fuse2fs")
RATIO_KEYS = ("wall_s", "cpu_s", "read_requests", "write_requests")
FS_COLORS = {"ext4": "#1f77b4", "xfs": "#ff7f0e", "btrfs": "#2ca02c", "fuse2fs": "#7f7f7f", "dxfs": "#d62728",
             "dxfs-noreserve": "#e377c2", "dxfs-noprefetch": "#9467bd", "dxfs-noxattrfilter": "#8c564b",
             "dxfs-noaccounting": "#bcbd22", "dxfs-rdplus-auto": "#17becf"}


# ----------------------------------------------------------------------------------------
# Ratios


def _ratio(value, ref):
    if not isinstance(value, (int, float)) or not isinstance(ref, (int, float)) or isinstance(value, bool):
        return None
    if isinstance(ref, bool) or ref == 0:
        return None
    return round(value / ref, 3)


def _ok_phases(result):
    if not result or "phases" not in result:
        return {}
    return {p["name"]: p for p in result["phases"] if p["outcome"] == "ok"}


def add_ratios(run):
    """Give every phase and metric of every result its ratio to ext4's and to fuse2fs's
    (None where the reference did not run that phase or the reference value is zero)."""
    for wl in run["workloads"].values():
        refs = {r: wl["results"].get(r) for r in REFERENCES}
        ref_phases = {r: _ok_phases(res) for r, res in refs.items()}
        for result in wl["results"].values():
            for phase in result.get("phases", []):
                phase["ratios"] = {
                    r: {k: _ratio(phase.get(k), ref_phases[r].get(phase["name"], {}).get(k)) for k in RATIO_KEYS}
                    for r in REFERENCES
                }
            if "metrics" in result:
                result["metric_ratios"] = {
                    r: {
                        k: _ratio(v, ((refs[r] or {}).get("metrics") or {}).get(k))
                        for k, v in result["metrics"].items()
                    }
                    for r in REFERENCES
                }


# ----------------------------------------------------------------------------------------
# Formatting


def fmt(value):
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}".replace(",", "\u202f")
    if isinstance(value, float):
        a = abs(value)
        if a >= 1000:
            return f"{value:,.0f}".replace(",", "\u202f")
        if a >= 100:
            return f"{value:.0f}"
        if a >= 10:
            return f"{value:.1f}"
        if a >= 1:
            return f"{value:.2f}"
        return f"{value:.3g}"
    return str(value).replace("|", "\\|")


def fmt_ratio(value):
    return "–" if value is None else f"{value:.2f}"


def table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(fmt(c) if not isinstance(c, str) else c for c in row) + " |" for row in rows]
    return "\n".join(lines)


def status_text(result):
    status = result.get("status", "?")
    reason = result.get("reason")
    return f"{status}: {reason}" if reason and status != "ok" else status


# ----------------------------------------------------------------------------------------
# Tables


def phase_table(wl):
    """One row per phase and filesystem: time, CPU, requests, each with its ratios."""
    header = [
        "phase", "fs", "wall s", "×ext4", "×fuse2fs", "µs/op", "CPU s app", "CPU s daemon",
        "read req", "×ext4", "×fuse2fs", "write req", "×ext4", "×fuse2fs", "read MiB", "write MiB",
    ]  # fmt: skip
    phase_names = []
    for result in wl["results"].values():
        for p in result.get("phases", []):
            if p["name"] not in phase_names:
                phase_names.append(p["name"])
    rows = []
    for name in phase_names:
        for fs, result in wl["results"].items():
            p = next((p for p in result.get("phases", []) if p["name"] == name), None)
            if p is None:
                continue
            r = p.get("ratios", {})
            e, f = r.get("ext4", {}), r.get("fuse2fs", {})
            wall = fmt(p["wall_s"]) + ("" if p["outcome"] == "ok" else f" ({p['outcome']})")
            rows.append([
                name, fs, wall, fmt_ratio(e.get("wall_s")), fmt_ratio(f.get("wall_s")), fmt(p["us_per_op"]),
                fmt(p["app_cpu_s"]), fmt(p["daemon_cpu_s"]),
                _reads(p), fmt_ratio(e.get("read_requests")), fmt_ratio(f.get("read_requests")),
                _writes(p), fmt_ratio(e.get("write_requests")), fmt_ratio(f.get("write_requests")),
                fmt(p["read_mib"]), fmt(p["write_mib"]),
            ])  # fmt: skip
    return table(header, rows) if rows else ""


def _reads(p):
    """Read requests of a phase, plus those the cold mount before it did."""
    early = (p.get("at_mount") or {}).get("read_requests", 0)
    return fmt(p["read_requests"]) + (f" (+{fmt(early)} at mount)" if early else "")


def _writes(p):
    """Write requests of a phase, plus those its data caused only at the next unmount."""
    later = (p.get("after_unmount") or {}).get("write_requests", 0)
    return fmt(p["write_requests"]) + (f" (+{fmt(later)} at unmount)" if later else "")


def metric_table(wl):
    """One row per filesystem: the workload's metrics, with ratios for those that have them."""
    specs = wl["metrics"]
    if not specs:
        return ""
    header = ["fs"]
    for m in specs:
        header.append(m["label"])
        if m["ratio"]:
            header += ["×ext4", "×fuse2fs"]
    rows = []
    for fs, result in wl["results"].items():
        if "metrics" not in result:
            continue
        row = [fs]
        ratios = result.get("metric_ratios", {})
        for m in specs:
            row.append(fmt(result["metrics"].get(m["key"])))
            if m["ratio"]:
                row += [fmt_ratio(ratios.get(r, {}).get(m["key"])) for r in REFERENCES]
        rows.append(row)
    return table(header, rows) if rows else ""


def status_table(wl):
    rows = []
    for fs, result in wl["results"].items():
        fsck = result.get("fsck_clean")
        rows.append([fs, status_text(result), fmt(result.get("seconds")), "–" if fsck is None else fmt(fsck)])
    return table(["fs", "status", "seconds", "fsck clean"], rows)


def summary_tables(run, fs_names):
    """Wall seconds of every phase per filesystem, then the same as ratios to ext4 and to fuse2fs."""
    rows_s, rows_e, rows_f = [], [], []
    for key, wl in run["workloads"].items():
        names = []
        for result in wl["results"].values():
            names += [p["name"] for p in result.get("phases", []) if p["name"] not in names]
        for name in names:
            cells = [_ok_phases(wl["results"].get(fs)).get(name) for fs in fs_names]
            rows_s.append([key, name] + [fmt(c["wall_s"]) if c else "–" for c in cells])
            rows_e.append([key, name] + [fmt_ratio(c["ratios"]["ext4"]["wall_s"]) if c else "–" for c in cells])
            rows_f.append([key, name] + [fmt_ratio(c["ratios"]["fuse2fs"]["wall_s"]) if c else "–" for c in cells])
    header = ["workload", "phase", *fs_names]
    return table(header, rows_s), table(header, rows_e), table(header, rows_f)


# ----------------------------------------------------------------------------------------
# Plots


def _phase_value(run, wl, fs, phase, key):
    p = _ok_phases(run["workloads"].get(wl, {}).get("results", {}).get(fs)).get(phase)
    if not p:
        return None
    if key == "reads_with_mount":
        if p["read_requests"] is None:
            return None  # no block device to count (dxfs on NBD)
        return p["read_requests"] + ((p.get("at_mount") or {}).get("read_requests") or 0)
    return p.get(key)


def _grouped_bars(ax, groups, values_by_fs, ylabel, log=False):
    """Bars for each group (x) and filesystem (colour); missing values leave a gap."""
    fs_names = [fs for fs, vals in values_by_fs.items() if any(v is not None for v in vals)]
    width = 0.8 / max(1, len(fs_names))
    for i, fs in enumerate(fs_names):
        xs = [g + (i - (len(fs_names) - 1) / 2) * width for g in range(len(groups))]
        ys = [v if v is not None else (float("nan") if log else 0) for v in values_by_fs[fs]]
        ax.bar(xs, ys, width, label=fs, color=FS_COLORS.get(fs))
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels(groups, fontsize=8)
    ax.set_ylabel(ylabel)
    if log:
        ax.set_yscale("log")
    ax.set_ylim(top=ax.get_ylim()[1] * (6 if log else 1.25))  # headroom for the legend
    ax.legend(fontsize=7, ncol=len(fs_names), loc="upper center")
    ax.grid(axis="y", alpha=0.3)


def _phase_bars(run, plt, path, wl, phases, title):
    fs_names = list(run["filesystems"])
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for ax, key, label, log in (
        (ax1, "wall_s", "wall seconds (log)", True),
        (ax2, "reads_with_mount", "read requests", False),
    ):
        values = {fs: [_phase_value(run, wl, fs, p, key) for p in phases] for fs in fs_names}
        _grouped_bars(ax, phases, values, label, log=log)
    ax2.set_title("loop device read requests (with those of the cold mount)", fontsize=9)
    ax1.set_title("wall time", fontsize=9)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def plot_steady(run, plt, path):
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    drawn = False
    for fs, result in run["workloads"].get("steady", {}).get("results", {}).items():
        points = result.get("series", {}).get("dir_size")
        if not points:
            continue
        drawn = True
        xs = [p[0] for p in points]
        ax1.plot(xs, [p[1] / 1024 for p in points], label=fs, color=FS_COLORS.get(fs))
        ax2.plot(xs, [p[2] / 1024 for p in points], label=fs, color=FS_COLORS.get(fs))
    if not drawn:
        plt.close(fig)
        return None
    for ax, what in ((ax1, "st_size KiB"), (ax2, "st_blocks × 512, KiB")):
        ax.set_xlabel("delete+create cycles")
        ax.set_ylabel(f"directory {what}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("Steady state: directory size under churn at a fixed population (seed 000)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def plot_namelen(run, plt, path):
    fig, ax = plt.subplots(figsize=(7, 4))
    drawn = False
    for fs, result in run["workloads"].get("namelen", {}).get("results", {}).items():
        points = [p for p in result.get("series", {}).get("lookup_us_by_length", []) if p[1] is not None]
        if points:
            drawn = True
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=fs, color=FS_COLORS.get(fs))
    if not drawn:
        plt.close(fig)
        return None
    ax.set_xlabel("name length (bytes)")
    ax.set_ylabel("cold lookup (stat) µs per name")
    ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title("Lookup cost against name length, cold cache (seed 000)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def plot_massdel(run, plt, path):
    results = run["workloads"].get("massdel", {}).get("results", {})
    fs_names = [fs for fs, r in results.items() if r.get("metrics", {}).get("peak_size")]
    if not fs_names:
        return None
    fig, ax = plt.subplots(figsize=(7, 4))
    groups = ["peak st_size", "after st_size", "peak blocks", "after blocks"]
    keys = ["peak_size", "after_size", "peak_alloc", "after_alloc"]
    values = {fs: [(results[fs]["metrics"].get(k) or None) for k in keys] for fs in fs_names}
    values = {fs: [v / 1024 if v else None for v in vs] for fs, vs in values.items()}
    _grouped_bars(ax, groups, values, "KiB (log)", log=True)
    ax.set_title("Mass delete: directory size before and after deleting 99% (seed 000)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def plot_dd(run, plt, path):
    fs_names = list(run["filesystems"])
    phases = ["dd_far", "dd_near", "dd_over"]
    values = {fs: [_phase_value(run, "dd", fs, p, "wall_s") for p in phases] for fs in fs_names}
    fill = run["workloads"].get("fill", {}).get("results", {})
    fill_values = {fs: [fill.get(fs, {}).get("metrics", {}).get("fill_percent_of_volume")] for fs in fs_names}
    if not any(v is not None for vs in list(values.values()) + list(fill_values.values()) for v in vs):
        return None
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4), gridspec_kw={"width_ratios": [3, 2]})
    _grouped_bars(ax1, ["far from full", "getting full", "over full"], values, "seconds")
    ax1.set_title("dd with fsync (seed 003)", fontsize=9)
    _grouped_bars(ax2, ["written at first ENOSPC"], fill_values, "% of volume size")
    ax2.set_title("fill level at the first ENOSPC", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def make_plots(run, plot_dir):
    """Every plot whose data exists; returns {workload key: [png paths]}."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(plot_dir, exist_ok=True)
    out = {}
    jobs = (
        ("steady", lambda p: plot_steady(run, plt, p), "steady-state-dir-size.png"),
        ("namelen", lambda p: plot_namelen(run, plt, p), "lookup-vs-name-length.png"),
        ("massdel", lambda p: plot_massdel(run, plt, p), "mass-delete-dir-size.png"),
        (
            "lsrm",
            lambda p: _phase_bars(
                run, plt, p, "lsrm", ["ls_l_readdir_order", "ls_l_inode_order", "rm_rf"], "Cold ls -l and rm -rf"
            ),
            "cold-ls-rm.png",
        ),
        (
            "interleave",
            lambda p: _phase_bars(
                run, plt, p, "interleave", ["ls_l_each_dir_cold", "rm_rf_each_dir_cold"], "Interleaved directories"
            ),
            "interleaved-dirs.png",
        ),
        ("acl", lambda p: _phase_bars(run, plt, p, "acl", ["walk_cold", "walk_warm"], "ls -lR + ACL getxattr"), "acl-walk.png"),
        ("dd", lambda p: plot_dd(run, plt, p), "enospc-dd-fill.png"),
    )
    for key, draw, name in jobs:
        if key in run["workloads"]:
            made = draw(os.path.join(plot_dir, name))
            if made:
                out.setdefault(key, []).append(made)
    return out


# ----------------------------------------------------------------------------------------
# The Markdown section


def storage_of(run):
    """The run's storage; results files from before the option were all on tmpfs."""
    tmpfs = {"kind": "tmpfs", "delay_ms": None, "text": "sparse file on /dev/shm behind a loop device"}
    return run.get("storage") or tmpfs


def _storage_lines(st):
    if st.get("delay_ms") is None:
        return []
    return [
        f"- Storage: **{st['text']}**: {st['detail']}. Not comparable with runs on plain tmpfs.",
        "- dxfs has no loop device here, so its read/write request and MiB columns are – (not measured), "
        "and so are its ratios of them; the kernel filesystems' and fuse2fs's counts are of their loop device "
        "over nbdfuse.",
    ]


def _run_section(run, json_path, rel):
    m, s = run["machine"], run["scale"]
    st = storage_of(run)
    tools = ", ".join(f"{k} {v!s}" for k, v in run["tools"].items() if v)
    on = "each a sparse file on /dev/shm behind its own loop device"
    if st.get("delay_ms") is not None:
        on = "each served by its own nbdkit (see Storage)"
    lines = [
        f"Generated by `bench/run.py` on {run['started_at']} (mode **{run['mode']}**, storage **{st['text']}**, "
        f"{run.get('elapsed_s', 0) / 60:.1f} min). Everything between the bench markers is rewritten by the runner.",
        "",
        f"- Command: `{run['command']}`",
        f"- Machine: {m['nproc']} CPUs ({m['cpu']}), {m['memory_gib']} GiB RAM, Linux {m['kernel']}, "
        f"{m['os']}, Python {m['python']}",
        f"- Tools: {tools}",
        f"- dxfs source: {run.get('dxfs_source') or 'unknown'}",
        f"- Volumes: {s['volume_mib']} MiB ({s['small_volume_mib']} MiB for the out-of-space workloads), one per "
        f"filesystem and workload, {on}; every "
        "filesystem is made, mounted, checked (fsck) and removed by the runner.",
        *_storage_lines(st),
        f"- Budget: {s['budget_s']:g} s per workload and filesystem (loops stop and say `timeout`), "
        f"{s['total_budget_min']:g} min per run.",
    ]
    for m in run.get("merged_from", []):
        lines.append(
            f"- Results of {', '.join(m['filesystems'])} taken from an earlier run of the same workloads and sizes "
            f"(`{m['command']}`, {m['started_at']}): the peers do not depend on the dxfs build."
        )
    if json_path:
        lines.append(f"- Raw results: `{rel(json_path)}`")
    return "\n".join(lines)


def _fs_section(run):
    rows = []
    for name, fs in run["filesystems"].items():
        status = "available" if fs["available"] else f"**not available**: {fs['reason']}"
        rows.append([name, status, f"`{fs['mkfs']}`", f"`{fs['mount']}`", f"`{fs['fsck']}`"])
    return table(["fs", "status", "mkfs", "mount", "fsck"], rows)


def _floor_section(run):
    f = run.get("python_floor")
    if not f:
        return ""
    return (
        f"The workload loops themselves, run on tmpfs ({f['files']} files), cost this much per call. "
        "That includes tmpfs's own (small) kernel work, so it is an upper bound on the runner's share of a "
        "µs/op figure: Python adds a few µs per call, against ~10 µs for a FUSE round trip.\n\n"
        + table(
            ["bare loop µs", "create+close µs", "stat µs", "unlink µs"],
            [[fmt(f["loop_us"]), fmt(f["create_us"]), fmt(f["stat_us"]), fmt(f["unlink_us"])]],
        )
    )


def _scale_line(key, s):
    """The sizes one workload ran with, in words."""
    return {
        "create": f"{s['files']:,} files",
        "namelen": f"{s['files_per_length']:,} files per length, lengths {', '.join(map(str, s['name_lengths']))}",
        "steady": f"population {s['steady_population']:,}, {s['steady_cycles']:,} cycles, {s['steady_samples']} samples",
        "massdel": f"{s['massdel_files']:,} files, 1% kept",
        "lsrm": f"{s['ls_files']:,} files",
        "interleave": f"{s['interleave_dirs']} directories × {s['interleave_files']} files",
        "acl": f"{s['acl_dirs']} directories × {s['acl_files']} files, 10% with an ACL",
        "dd": f"{s['dd_mib']} MiB per dd",
        "fill": f"tarball of {s['tar_full_files']:,} small files",
        "blurt": f"{s['blurt_tasks']} tasks × {s['blurt_writes']} KiB, up to {s['blurt_rounds']} rounds of 9 directories",
        "fio": f"{s['fio_mib']} MiB file, random jobs {s['fio_runtime_s']} s each",
        "untar": f"{s['untar_files']:,} files",
        "fsmark": f"{s['fsmark_files']:,} files of {s['fsmark_kib']} KiB",
    }.get(key, "")


def _alarming(line):
    """A daemon's stderr line worth showing in the report (errors, not routine warnings)."""
    low = line.lower()
    return any(word in low for word in ("error", "panic", "corrupt", "fail"))


def _workload_section(key, wl, run, plots, rel):
    parts = [f"### {key}: {wl['title']} (seed {wl['seeds']})", "", wl["doc"], ""]
    parts.append(f"Sizes: {_scale_line(key, run['scale'])}; volume {wl['volume_mib']} MiB.")
    parts += ["", status_table(wl)]
    for body in (phase_table(wl), metric_table(wl)):
        if body:
            parts += ["", body]
    for png in plots.get(key, []):
        parts += ["", f"![{key}]({rel(png)})"]
    notes = [f"- {fs}: {n}" for fs, r in wl["results"].items() for n in r.get("notes", [])]
    for fs, r in wl["results"].items():
        for log in r.get("daemon_log", []):
            if r.get("status") != "ok" or any(_alarming(line) for line in log["tail"]):
                notes.append(f"- {fs} daemon stderr ({log['lines']} lines), last: `{log['tail'][-1][:200]}`")
    if notes:
        parts += ["", "Notes:", *notes]
    return "\n".join(parts)


METHOD_NOTES = """\
How to read the tables:
- *wall s* includes the flush at the end of a writing phase (syncfs of the mount, then fsync of the
  loop device), so deferred writes are paid for in the phase that caused them; writes that only happen at
  the next unmount are shown as "+N at unmount" on the last writing phase before it (a filesystem that
  defers its writes past syncfs shows them there).
- *cold* phases unmount, `echo 3 > /proc/sys/vm/drop_caches` and mount again first; FUSE daemons are
  restarted by that, so their own caches are cold too.
- *CPU s app* is user+sys of the runner and its children (rm, tar, fio); *CPU s daemon* is user+sys of the
  FUSE daemon (from /proc/PID/stat, 10 ms ticks). Kernel filesystems' background threads (jbd2, kworkers)
  are in neither.
- *read/write req* and MiB come from /sys/block/loopN/stat before and after each phase; reads done by the
  mount that starts a cold phase are shown as "+N at mount" (a filesystem that reads ahead at mount time
  shows them there).
- *×ext4* and *×fuse2fs* divide by the same phase on kernel ext4 and on fuse2fs in this run (below 1 is
  fewer seconds or requests); – means the reference did not complete that phase.
- The runner runs as root, so ext4's 5% root reserve is usable by the out-of-space workloads.
- dxfs and fuse2fs daemons are started in the foreground by the runner (the same as `--daemon` minus the
  fork) so that their pid, and so their CPU time, is known; they are stopped with `fusermount3 -u`."""


def markdown(run, json_path=None, plots=None, report_dir="."):
    """The generated section (without the markers)."""
    plots = plots or {}
    fs_names = list(run["filesystems"])

    def rel(path):
        return os.path.relpath(path, report_dir)

    secs, ratio_e, ratio_f = summary_tables(run, fs_names)
    st = storage_of(run)
    on_storage = "" if st.get("delay_ms") is None else f" on **{st['text']}**"
    parts = [
        "## Run",
        _run_section(run, json_path, rel),
        "",
        "## Filesystems",
        _fs_section(run),
        "",
        "## Python floor",
        _floor_section(run),
        "",
        "## Summary",
        f"Wall seconds of every phase{on_storage} (lower is better):",
        "",
        secs,
        "",
        "Ratio to kernel ext4 (wall time; below 1 is faster than ext4):",
        "",
        ratio_e,
        "",
        "Ratio to fuse2fs (wall time; below 1 is faster than fuse2fs):",
        "",
        ratio_f,
        "",
        "## Workloads",
    ]
    for key, wl in run["workloads"].items():
        parts += ["", _workload_section(key, wl, run, plots, rel)]
    parts += ["", "## Method", METHOD_NOTES]
    return "\n".join(parts)


def write_section(report_path, body):
    """Replace what lies between the bench markers in `report_path` (created if missing)."""
    block = f"{BEGIN}\n{body.rstrip()}\n{END}"
    if os.path.exists(report_path):
        with open(report_path) as f:
            text = f.read()
    else:
        text = "# Benchmarks\n\nResults of `bench/run.py` (see bench/README.md for how to run it).\n\n"
    if BEGIN in text and END in text and text.index(BEGIN) < text.index(END):
        head, rest = text.split(BEGIN, 1)
        tail = rest.split(END, 1)[1]
        text = head + block + tail
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    os.makedirs(os.path.dirname(os.path.abspath(report_path)), exist_ok=True)
    with open(report_path, "w") as f:
        f.write(text)
