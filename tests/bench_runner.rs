//! The benchmark runner (`bench/run.py`) at its tiny CI size: it must set up, measure and
//! tear down every filesystem it is given, and write results of the documented shape.
//! Checks the structure of the JSON and of the report section, never the speed.
//!
//! Skipped (with a message) unless running as root with /dev/loop-control and python3.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

use serde_json::Value;

/// The two tests each start a whole runner; one at a time is enough for 2 cores.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Why the runner cannot run here, if it cannot.
fn skip_reason() -> Option<String> {
    match fs::metadata("/proc/self") {
        Ok(m) if m.uid() == 0 => {}
        _ => return Some("not running as root".into()),
    }
    if !Path::new("/dev/loop-control").exists() {
        return Some("/dev/loop-control missing".into());
    }
    if !Path::new("/dev/shm").is_dir() {
        return Some("/dev/shm missing".into());
    }
    match Command::new("python3").arg("--version").output() {
        Ok(o) if o.status.success() => None,
        _ => Some("python3 not found".into()),
    }
}

/// `python3 bench/run.py --quick --tiny --fs FS --out DIR --report DIR/BENCHMARKS.md`,
/// returning the results JSON and the report text.
fn run_bench(fs_list: &str, out: &Path, extra: &[&str]) -> (Value, String) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("bench/run.py");
    let report = out.join("BENCHMARKS.md");
    let output = Command::new("python3")
        .arg(&script)
        .args(["--quick", "--tiny", "--no-install", "--no-plots", "--fs", fs_list, "--out"])
        .arg(out)
        .arg("--report")
        .arg(&report)
        .args(extra)
        .output()
        .expect("start python3 bench/run.py");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "bench/run.py failed ({}):\n{stderr}", output.status);
    let json = fs::read_dir(out)
        .expect("read --out")
        .map(|e| e.expect("dir entry").path())
        .find(|p| p.extension().is_some_and(|x| x == "json"))
        .unwrap_or_else(|| panic!("no results JSON in {}:\n{stderr}", out.display()));
    let run: Value = serde_json::from_str(&fs::read_to_string(&json).expect("read JSON")).expect("valid JSON");
    (run, fs::read_to_string(&report).expect("report written"))
}

fn is_number(v: &Value) -> bool {
    v.is_number()
}

/// Every phase has times, request counts and both ratio fields.
fn check_phase(where_: &str, p: &Value) {
    assert!(p["name"].is_string(), "{where_}: phase without a name: {p}");
    for key in ["wall_s", "cpu_s", "app_cpu_s", "sync_s", "read_mib", "write_mib"] {
        assert!(is_number(&p[key]), "{where_}/{}: {key} missing: {p}", p["name"]);
    }
    for key in ["read_requests", "write_requests", "read_sectors", "write_sectors", "flush_requests"] {
        assert!(p[key].is_u64(), "{where_}/{}: {key} missing: {p}", p["name"]);
    }
    for reference in ["ext4", "fuse2fs"] {
        let r = &p["ratios"][reference];
        assert!(r.is_object(), "{where_}/{}: no ratio to {reference}: {p}", p["name"]);
        for key in ["wall_s", "read_requests", "write_requests"] {
            assert!(r.get(key).is_some(), "{where_}/{}: ratio {reference}.{key} missing", p["name"]);
        }
    }
}

/// The whole results file: run description, filesystems, and each workload per filesystem.
/// `must_succeed` filesystems have to complete every workload whose tools are installed.
fn check_run(run: &Value, fs_names: &[&str], must_succeed: &[&str]) {
    assert_eq!(run["schema"], "fsbench/1");
    assert_eq!(run["mode"], "tiny");
    for key in ["command", "started_at", "finished_at"] {
        assert!(run[key].is_string(), "{key} missing");
    }
    for key in ["nproc", "memory_gib", "kernel", "cpu"] {
        assert!(!run["machine"][key].is_null(), "machine.{key} missing");
    }
    for key in ["create_us", "stat_us", "unlink_us"] {
        assert!(is_number(&run["python_floor"][key]), "python_floor.{key} missing");
    }
    for fs in fs_names {
        let f = &run["filesystems"][fs];
        assert!(f["available"].is_boolean(), "filesystems.{fs}.available missing");
        assert!(f["mkfs"].is_string() && f["mount"].is_string() && f["fsck"].is_string());
    }
    let workloads = run["workloads"].as_object().expect("workloads");
    assert_eq!(workloads.len(), 13, "every workload is selected by default");
    for (key, wl) in workloads {
        assert!(wl["title"].is_string() && wl["seeds"].is_string() && wl["doc"].is_string(), "{key}: description");
        for fs in fs_names {
            let where_ = format!("{key}/{fs}");
            let r = &wl["results"][fs];
            let status = r["status"].as_str().unwrap_or_else(|| panic!("{where_}: no status"));
            if must_succeed.contains(fs) && status == "not available" {
                // Only a missing tool (fio without --install) may keep a workload from running.
                let reason = r["reason"].as_str().unwrap_or("");
                assert!(reason.contains("not installed"), "{where_}: {reason}");
                continue;
            }
            if must_succeed.contains(fs) {
                assert_eq!(status, "ok", "{where_}: {}", r["reason"]);
            }
            if status == "not available" {
                assert!(r["reason"].is_string(), "{where_}: a reason is given");
                continue;
            }
            let phases = r["phases"].as_array().unwrap_or_else(|| panic!("{where_}: no phases"));
            assert!(!phases.is_empty() || status != "ok", "{where_}: ok without phases");
            for p in phases {
                check_phase(&where_, p);
            }
            assert!(r["metrics"].is_object() && r["metric_ratios"]["ext4"].is_object(), "{where_}: metrics");
            assert!(r["fsck"].is_array(), "{where_}: fsck results");
            if status == "ok" {
                assert_eq!(r["fsck_clean"], true, "{where_}: fsck after the workload: {}", r["fsck"]);
            }
        }
    }
}

fn check_report(report: &str, fs_names: &[&str]) {
    let begin = report.find("<!-- bench:begin -->").expect("begin marker");
    let end = report.find("<!-- bench:end -->").expect("end marker");
    let section = &report[begin..end];
    for heading in ["## Run", "## Filesystems", "## Summary", "## Workloads", "×ext4", "×fuse2fs"] {
        assert!(section.contains(heading), "report lacks {heading}");
    }
    for fs in fs_names {
        assert!(section.contains(&format!("| {fs} |")), "report has no row for {fs}");
    }
}

fn scratch() -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let out = tmp.path().join("results");
    (tmp, out)
}

#[test]
fn tiny_quick_run_on_ext4() {
    if let Some(why) = skip_reason() {
        assert!(
            std::env::var_os("DXFS_TEST_NO_SKIP").is_none_or(|v| v == "0"),
            "skipped, and DXFS_TEST_NO_SKIP forbids it: {why}"
        );
        eprintln!("skipping the benchmark runner test: {why}");
        return;
    }
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let (_tmp, out) = scratch();
    let (run, report) = run_bench("ext4", &out, &[]);
    assert_eq!(run["filesystems"]["ext4"]["available"], true, "{}", run["filesystems"]["ext4"]["reason"]);
    check_run(&run, &["ext4"], &["ext4"]);
    check_report(&report, &["ext4"]);
}

#[test]
fn tiny_quick_run_on_dxfs_and_ext4() {
    if let Some(why) = skip_reason() {
        assert!(
            std::env::var_os("DXFS_TEST_NO_SKIP").is_none_or(|v| v == "0"),
            "skipped, and DXFS_TEST_NO_SKIP forbids it: {why}"
        );
        eprintln!("skipping the benchmark runner test: {why}");
        return;
    }
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let (_tmp, out) = scratch();
    let (run, report) = run_bench("dxfs,ext4", &out, &["--dxfs-bin", env!("CARGO_BIN_EXE_dxfs")]);
    let dxfs = &run["filesystems"]["dxfs"];
    if dxfs["available"] != true {
        // The runner probes mkfs + mount + write + fsck; say why dxfs could not run and
        // still check that it was reported as such and that ext4 ran.
        eprintln!("dxfs cannot mount here, checked as 'not available': {}", dxfs["reason"]);
        assert!(dxfs["reason"].is_string());
    }
    check_run(&run, &["dxfs", "ext4"], &["ext4"]);
    check_report(&report, &["dxfs", "ext4"]);
}
