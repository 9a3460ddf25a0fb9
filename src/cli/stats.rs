//! `dxfs stats MOUNTPOINT`: the requests a live mount has served, per opcode, with the
//! time the daemon spent on each (read from the root's virtual xattr).

use std::path::PathBuf;

use super::fail;

#[derive(clap::Args)]
pub struct StatsArgs {
    /// The mount point.
    mountpoint: PathBuf,
    /// Print the counters as JSON.
    #[arg(long)]
    json: bool,
}

pub fn run(a: StatsArgs) -> i32 {
    let raw = match xattr::get(&a.mountpoint, dxfs::fuse::STATS_XATTR) {
        Ok(Some(v)) => v,
        Ok(None) => return fail(format!("{}: not a dxfs mount (no request counters)", a.mountpoint.display()), 8),
        Err(e) => return fail(format!("{}: {e} (not a dxfs mount?)", a.mountpoint.display()), 8),
    };
    let text = String::from_utf8_lossy(&raw);
    if a.json {
        return emit(&format!("{text}\n"));
    }
    let v: serde_json::Value = match serde_json::from_str(&text) {
        Ok(v) => v,
        Err(e) => return fail(format!("bad counters from the daemon: {e}"), 8),
    };
    let mut out = format!("{:<12} {:>12} {:>12} {:>12} {:>12}\n", "request", "count", "mean µs", "max µs", "total ms");
    if let Some(ops) = v["ops"].as_object() {
        let mut rows: Vec<_> = ops.iter().collect();
        rows.sort_by_key(|(_, o)| std::cmp::Reverse(o["count"].as_u64().unwrap_or(0)));
        for (name, o) in rows {
            out += &format!(
                "{:<12} {:>12} {:>12.2} {:>12.0} {:>12.1}\n",
                name,
                o["count"].as_u64().unwrap_or(0),
                o["mean_us"].as_f64().unwrap_or(0.0),
                o["max_us"].as_f64().unwrap_or(0.0),
                o["total_us"].as_f64().unwrap_or(0.0) / 1000.0
            );
        }
    }
    out += &format!(
        "{} requests in {:.1} s, {} through io_uring ({} had to wait and went to kept threads); {} READDIRPLUS entries without attributes; transport: {}\n",
        v["requests"],
        v["seconds"].as_f64().unwrap_or(0.0),
        v["via_ring"],
        v["writes_waited"].as_u64().unwrap_or(0),
        v["entries_without_attrs"].as_u64().unwrap_or(0),
        v["transport"].as_str().unwrap_or("?")
    );
    emit(&out)
}

/// Print `text`; a reader that went away (`| head`) is not an error.
fn emit(text: &str) -> i32 {
    use std::io::Write;
    match std::io::stdout().write_all(text.as_bytes()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => fail(format!("stdout: {e}"), 8),
        _ => 0,
    }
}
