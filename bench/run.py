#!/usr/bin/env python3
"""Benchmark dxfs side by side with kernel ext4, XFS, btrfs and fuse2fs.

    python3 bench/run.py --quick --report docs/bench/NAME.md
    python3 bench/run.py --full --fs dxfs,ext4 --workloads lsrm,steady
    python3 bench/run.py --from-json bench/results/run-....json --report docs/bench/NAME.md
    python3 bench/run.py --quick --delay-ms 1 --report docs/bench/NAME.md   # storage with 1 ms latency

Every filesystem gets a fresh volume of the same size per workload, on a loop device
backed by a sparse file on /dev/shm. Needs root. See bench/README.md.

--delay-ms D serves each volume's file through nbdkit's delay filter instead (D ms on
every read and write, flushes not delayed): kernel filesystems and fuse2fs on a loop
device over nbdfuse, dxfs through its own NBD client (no loop device, so no block counters).
"""

import argparse
import dataclasses
import datetime
import json
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from fsbench import report, system  # noqa: E402
from fsbench.context import Progress  # noqa: E402
from fsbench.filesystems import DXFS_VARIANTS, all_filesystems  # noqa: E402
from fsbench.runner import Runner, command_line, repo_root  # noqa: E402
from fsbench.scales import SCALES  # noqa: E402
from fsbench.workloads import WORKLOADS  # noqa: E402

FS_ORDER = ("ext4", "xfs", "btrfs", "fuse2fs", "dxfs")


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="a few minutes (the default)")
    mode.add_argument("--full", action="store_true", help="seed-sized runs, bounded under an hour on 2 cores")
    p.add_argument("--tiny", action="store_true", help="CI size: seconds per filesystem (with --quick)")
    p.add_argument(
        "--fs",
        default=",".join(FS_ORDER),
        help=f"comma-separated, from {','.join(FS_ORDER)}, or the dxfs A/B variants {','.join(DXFS_VARIANTS)}",
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FIELD=N",
        help="override one workload size of the mode, e.g. --set ls_files=1000000 (repeatable)",
    )
    p.add_argument("--workloads", default=",".join(WORKLOADS), help=f"comma-separated, from {','.join(WORKLOADS)}")
    p.add_argument("--out", default=os.path.join(repo_root(), "bench", "results"), help="directory for the JSON")
    p.add_argument("--report", help="Markdown file whose generated section to (re)write, e.g. docs/bench/NAME.md")
    p.add_argument("--plots", help="directory for the PNGs (default: bench/ beside the report, else OUT/plots)")
    p.add_argument("--dxfs-bin", default=default_dxfs_binary(), help="the dxfs binary (default: %(default)s)")
    p.add_argument(
        "--delay-ms",
        type=_delay,
        metavar="D",
        help="storage with latency: serve every volume through nbdkit's delay filter, D ms on each read and write "
        "(0: nbdkit without the filter); default: none, a loop device over tmpfs",
    )
    p.add_argument("--no-install", action="store_true", help="do not apt-get/pip install missing tools")
    p.add_argument("--no-plots", action="store_true", help="skip the PNGs (no matplotlib needed)")
    p.add_argument("--from-json", help="do not run: rewrite the report from this results file")
    p.add_argument("--list", action="store_true", help="list the workloads and exit")
    p.add_argument(
        "--keep-from",
        metavar="JSON",
        help="after the run, add the results of filesystems that were not run from this earlier results file "
        "(same workloads and sizes), e.g. to rerun only dxfs after a change",
    )
    args = p.parse_args(argv)
    args.fs_names = _selection(p, "--fs", args.fs, FS_ORDER + tuple(DXFS_VARIANTS))
    args.workload_keys = _selection(p, "--workloads", args.workloads, tuple(WORKLOADS))
    if args.tiny and args.full:
        p.error("--tiny goes with --quick")
    args.mode = "tiny" if args.tiny else "full" if args.full else "quick"
    return args


def _delay(text):
    """Whole milliseconds: what nbdkit's delay filter takes."""
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r}: expected whole milliseconds, e.g. 1")
    return int(text)


def _selection(parser, flag, text, known):
    chosen = [x.strip() for x in text.split(",") if x.strip()]
    unknown = [x for x in chosen if x not in known]
    if unknown or not chosen:
        parser.error(f"{flag}: unknown {', '.join(unknown) or '(empty)'}; choose from {','.join(known)}")
    return [x for x in known if x in chosen]  # canonical order


def default_dxfs_binary():
    for candidate in (
        os.path.join(repo_root(), "target", "release", "dxfs"),
        shutil.which("dxfs"),
    ):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


def save_json(run, out_dir):
    os.makedirs(out_dir, exist_ok=True)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    path = os.path.join(out_dir, f"run-{stamp}-{run['mode']}.json")
    with open(path, "w") as f:
        json.dump(run, f, indent=1)
        f.write("\n")
    return path


def write_report(run, json_path, args, log):
    """PNGs (unless --no-plots) and the generated section of the report, if one was asked for."""
    report_dir = os.path.dirname(os.path.abspath(args.report)) if args.report else os.path.abspath(args.out)
    plot_dir = args.plots or (os.path.join(report_dir, "bench") if args.report else os.path.join(args.out, "plots"))
    plots = {}
    if not args.no_plots:
        have = _has_matplotlib() if args.no_install else system.ensure_matplotlib(log) is not None
        if have:
            plots = report.make_plots(run, plot_dir)
            log(f"plots in {plot_dir}")
        else:
            log("matplotlib is not available: no plots")
    if args.report:
        report.write_section(args.report, report.markdown(run, json_path, plots, report_dir))
        log(f"report section written to {args.report}")


def _has_matplotlib():
    try:
        import matplotlib  # noqa: F401

        return True
    except ImportError:
        return False


def keep_results(run, path, log):
    """Add to `run` the results of the filesystems it did not run, from the results file
    `path` of an earlier run with the same workload sizes."""
    with open(path) as f:
        old = json.load(f)
    if old["scale"] != json.loads(json.dumps(run["scale"])):
        log(f"--keep-from {path}: its workload sizes differ from this run's; nothing kept")
        return
    if report.storage_of(old) != report.storage_of(run):
        log(f"--keep-from {path}: it ran on other storage ({report.storage_of(old)['text']}); nothing kept")
        return
    taken = set()
    # Workloads this run did not do come over whole (their dxfs results included).
    for key, wl in old.get("workloads", {}).items():
        if key not in run["workloads"]:
            run["workloads"][key] = wl
            taken.update(wl["results"])
    for key, wl in run["workloads"].items():
        for fs, res in old.get("workloads", {}).get(key, {}).get("results", {}).items():
            if fs not in wl["results"]:
                wl["results"][fs] = res
                taken.add(fs)
    for fs in taken:
        run["filesystems"].setdefault(fs, old["filesystems"].get(fs))
    # Report order: the earlier run's order, then this run's new entries.
    order = [fs for fs in old["filesystems"] if fs in run["filesystems"]] + [
        fs for fs in run["filesystems"] if fs not in old["filesystems"]
    ]
    run["filesystems"] = {fs: run["filesystems"][fs] for fs in order}
    for wl in run["workloads"].values():
        wl["results"] = {fs: wl["results"][fs] for fs in order if fs in wl["results"]}
    report.add_ratios(run)
    if taken:
        run.setdefault("merged_from", []).extend(old.get("merged_from", []))
        run["merged_from"].append(
            {"path": path, "command": old["command"], "started_at": old["started_at"], "filesystems": sorted(taken)}
        )
        log(f"kept the results of {', '.join(sorted(taken))} from {path}")


def main(argv):
    args = parse_args(argv[1:])
    progress = Progress()
    if args.list:
        for key, wl in WORKLOADS.items():
            print(f"{key:<11} seed {wl.seeds:<8} {wl.title}")
        return 0
    if args.from_json:
        with open(args.from_json) as f:
            run = json.load(f)
        write_report(run, os.path.abspath(args.from_json), args, progress.log)
        return 0
    scale = SCALES[args.mode]
    for item in args.set:
        field, _, value = item.partition("=")
        if not hasattr(scale, field) or field == "name" or not value.isdigit():
            print(f"--set {item}: expected FIELD=N with FIELD one of the sizes in bench/fsbench/scales.py")
            return 2
        scale = dataclasses.replace(scale, **{field: int(value)})
    runner = Runner(
        scale,
        all_filesystems(args.dxfs_bin and os.path.abspath(args.dxfs_bin)),
        args.fs_names,
        args.workload_keys,
        install=not args.no_install,
        progress=progress,
        delay_ms=args.delay_ms,
    )
    try:
        run = runner.run(command_line(argv))
    except KeyboardInterrupt:
        progress.log("interrupted: everything the runner set up has been torn down")
        return 130
    if args.keep_from:
        keep_results(run, args.keep_from, progress.log)
    json_path = save_json(run, args.out)
    progress.log(f"results: {json_path}")
    write_report(run, json_path, args, progress.log)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
