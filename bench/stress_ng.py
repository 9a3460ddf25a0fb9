"""stress-ng's filesystem class on kernel ext4 and on a plain dxfs mount, side by side.

Each stressor runs alone (`--seq 1`, one instance) for `--seconds` on each file system
in turn, on a fresh loop-device volume (bench/loopvol.py); its bogo-ops are printed
beside ext4's with the ratio, and every stressor below `--flag` of ext4's is listed
again at the end. A stressor that fails or is killed shows as such. Both volumes are
checked after unmounting (e2fsck -fn, dxfs fsck -n). Root.

    sudo python3 bench/stress_ng.py [--seconds 5] [--class filesystem] [--only a,b]
"""
import argparse, os, subprocess, sys, tempfile

sys.path.insert(0, os.path.dirname(__file__))
from loopvol import LoopVolume  # noqa: E402


def stress(mnt, args, seconds, timeout):
    """{stressor: bogo-ops} from one stress-ng run with `args`, its exit code, and the
    lines of its output that report a failure."""
    with tempfile.NamedTemporaryFile(suffix=".yaml", delete=False) as f:
        out = f.name
    cmd = ["stress-ng", "--temp-path", mnt, "-t", str(seconds), "--metrics-brief", "--yaml", out] + args
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    ops, name = {}, None
    for line in open(out):
        s = line.strip()
        if s.startswith("- stressor:"):
            name = s.split(":", 1)[1].strip()
        elif s.startswith("bogo-ops:") and name:
            ops[name] = int(float(s.split(":", 1)[1]))
    os.unlink(out)
    failed = [l for l in (p.stdout + p.stderr).splitlines() if "fail" in l.lower() and "passed" not in l.lower()]
    return ops, p.returncode, failed


def run_class(mnt, cls, seconds, only):
    """The class one stressor after another (`--seq 1`), or each of `only` alone (this
    stress-ng has no `--with`)."""
    if not only:
        return stress(mnt, ["--seq", "1", "--class", cls], seconds, seconds * 200 + 120)
    ops, rc, failed = {}, 0, []
    for s in only:
        o, r, f = stress(mnt, [f"--{s}", "1"], seconds, seconds * 10 + 60)
        ops.update(o)
        rc, failed = max(rc, r), failed + f
    return ops, rc, failed


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=int, default=5)
    ap.add_argument("--class", dest="cls", default="filesystem")
    ap.add_argument("--only", default="", help="comma-separated stressors instead of the class")
    ap.add_argument("--flag", type=float, default=0.10, help="list stressors below this share of ext4's")
    ap.add_argument("--size-gib", type=int, default=4)
    ap.add_argument("--dxfs-opts", default="", help="mount options for dxfs, e.g. keep_awake_us=auto")
    ap.add_argument("--targets", default="ext4,dxfs")
    ap.add_argument("--dxfs-bin", default=os.path.join(os.path.dirname(__file__), "..", "target", "release", "dxfs"))
    a = ap.parse_args()
    only = [s for s in a.only.split(",") if s]
    res = {}
    opts = ["-o", a.dxfs_opts] if a.dxfs_opts else []
    for fs in a.targets.split(","):
        with LoopVolume(fs, a.size_gib, os.path.abspath(a.dxfs_bin), "auto", opts, fsck=True) as v:
            res[fs] = run_class(v.mnt, a.cls, a.seconds, only)
        rc, out = v.fsck_result
        summary = [l for l in out.splitlines() if "files" in l or "clean" in l or "ERRORS" in l]
        res[fs] += ((rc, summary[-1] if summary else out.strip()[-200:]),)
        print(f"{fs}: stress-ng exit {res[fs][1]}, fsck exit {rc}: {res[fs][3][1]}", flush=True)
        for l in res[fs][2][:10]:
            print(f"  {l}")
    if len(res) < 2:
        for fs, r in res.items():
            for name, ops in sorted(r[0].items()):
                print(f"{name:<16}{ops:>12}")
        return
    e, d = res["ext4"][0], res["dxfs"][0]
    print(f"\n{'stressor':<16}{'ext4':>12}{'dxfs':>12}{'dxfs/ext4':>11}")
    low = []
    for s in sorted(set(e) | set(d)):
        x, y = e.get(s), d.get(s)
        r = (y / x) if x and y is not None else None
        print(f"{s:<16}{x if x is not None else '-':>12}{y if y is not None else '-':>12}"
              f"{(f'{r:.2f}' if r is not None else '-'):>11}")
        if r is not None and r < a.flag:
            low.append((s, r))
    print(f"\nbelow {a.flag:.0%} of ext4: " + (", ".join(f"{s} {r:.1%}" for s, r in low) or "none"))
    shares = [d[s] / e[s] for s in e if s in d and e[s]]
    for lo, hi in [(0.9, 1e9), (0.4, 0.9), (0.1, 0.4), (0, 0.1)]:
        print(f"  {sum(lo <= x < hi for x in shares)} stressors at {lo:.0%}–{hi if hi < 1e9 else float('inf'):.0%}")


if __name__ == "__main__":
    main()
