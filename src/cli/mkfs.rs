//! `dxfs mkfs` (also `mkfs.dxfs`): make a volume.

use std::path::PathBuf;
use std::sync::Arc;

use dxfs::block::{is_nbd_uri, open_device, BlockDevice, FileDevice};
use dxfs::hash::{format_seed, parse_seed, HashVersion};
use dxfs::{mkfs, MkfsOptions};

use super::{fail, parse_size};

#[derive(clap::Args)]
pub struct MkfsArgs {
    /// Image file, block device, or NBD export (nbd://HOST[:PORT]/EXPORT,
    /// nbd+unix:///EXPORT?socket=PATH; its size is the server's).
    image: PathBuf,
    /// Size of the image file to create, e.g. 512M, 4G (default: 1G for a new file).
    #[arg(long, short = 's')]
    size: Option<String>,
    /// Volume label (up to 32 bytes).
    #[arg(long, short = 'L', default_value = "")]
    label: String,
    /// Directory hash: legacy, half_md4, tea (or their _unsigned forms, or 0-5).
    #[arg(long, default_value = "half_md4")]
    hash: String,
    /// The 128-bit hash seed as a UUID (random by default).
    #[arg(long)]
    seed: Option<String>,
    /// Inode blocks (15 inodes each) in a directory's first reserved region.
    #[arg(long, default_value_t = 4)]
    region_blocks: u16,
    /// Do not keep the per-inode xattr-name bloom filter.
    #[arg(long)]
    no_xattr_filter: bool,
    /// Bits each xattr name sets in the bloom filter (1 = erofs's rule; the default is
    /// ln2 · 32 / n for the typical n = 2 names of an inode that has any).
    #[arg(long, default_value_t = dxfs::DEFAULT_FILTER_HASHES,
          value_parser = clap::value_parser!(u8).range(1..=32))]
    xattr_filter_hashes: u8,
    /// Write every inode free into its inode block (no lazy-free tree; the volume then
    /// lacks the LAZY_INODE_FREE feature and older readers can write it).
    #[arg(long)]
    no_lazy_inode_free: bool,
    /// No mount mark (MOUNT_MARK feature): a read-write open from another host sharing
    /// the device is then not recognised, and older readers can write the volume.
    #[arg(long)]
    no_mount_mark: bool,
    /// No recursive statistics on directories (no RSTATS feature: `dxfs du` then walks,
    /// and older readers can write the volume).
    #[arg(long)]
    no_rstats: bool,
    /// Every commit with two device flushes (no ONE_FLUSH_COMMIT feature: small deltas
    /// then do not log their file data), as older readers need.
    #[arg(long)]
    no_one_flush_commit: bool,
    /// Overwrite whatever the image or device holds (a filesystem, or any data).
    #[arg(long, short = 'f')]
    force: bool,
    /// Extended options, as mke2fs's: root_owner=UID:GID (the root directory's owner;
    /// by default whoever runs mkfs).
    #[arg(short = 'E', value_name = "OPTS")]
    extended: Vec<String>,
    /// Populate the new volume from this directory tree, or unpack this tar archive into
    /// it (as mke2fs -d); the root takes the directory's (or the archive's `./`) mode,
    /// owner, times and xattrs.
    #[arg(short = 'd', value_name = "DIR|ARCHIVE")]
    root_dir: Option<PathBuf>,
}

/// The root directory's owner from `-E root_owner=UID:GID`, else the caller.
fn root_owner(ext: &[String]) -> Result<(u32, u32), String> {
    let mut owner = (nix::unistd::geteuid().as_raw(), nix::unistd::getegid().as_raw());
    for opt in ext.iter().flat_map(|s| s.split(',')).filter(|s| !s.is_empty()) {
        match opt.split_once('=') {
            Some(("root_owner", v)) => {
                let (u, g) = v.split_once(':').ok_or(format!("root_owner wants UID:GID, not {v:?}"))?;
                owner = (
                    u.parse().map_err(|_| format!("bad uid {u:?}"))?,
                    g.parse().map_err(|_| format!("bad gid {g:?}"))?,
                );
            }
            _ => return Err(format!("unknown extended option {opt:?}")),
        }
    }
    Ok(owner)
}

pub fn run(a: MkfsArgs) -> i32 {
    let Some(hash) = HashVersion::parse(&a.hash) else {
        return fail(format!("unknown hash {:?}", a.hash), 8);
    };
    let seed = match &a.seed {
        Some(s) => match parse_seed(s) {
            Some(x) => Some(x),
            None => return fail(format!("bad seed {s:?} (want a UUID)"), 8),
        },
        None => None,
    };
    let root_owner = match root_owner(&a.extended) {
        Ok(o) => o,
        Err(e) => return fail(e, 8),
    };
    let nbd = is_nbd_uri(&a.image.to_string_lossy());
    let exists = nbd || a.image.exists();
    let dev: Arc<dyn BlockDevice> = if nbd {
        if a.size.is_some() {
            return fail("--size cannot resize an NBD export: its size is the server's", 8);
        }
        match open_device(&a.image.to_string_lossy(), false) {
            Ok(d) => {
                super::wait_for_a_closing_mark(&a.image.to_string_lossy(), &*d);
                d
            }
            Err(e) => return fail(e, 8),
        }
    } else if exists {
        super::wait_for_a_closing_holder(&a.image);
        let d = match FileDevice::open(&a.image, false) {
            Ok(d) => d,
            Err(e) => return fail(format!("{}: {e}", a.image.display()), 8),
        };
        if let Some(sz) = &a.size {
            let Some(bytes) = parse_size(sz) else { return fail(format!("bad size {sz:?}"), 8) };
            let is_file = std::fs::metadata(&a.image).map(|m| m.is_file()).unwrap_or(false);
            if bytes / 4096 > d.block_count() && !is_file {
                return fail(
                    format!(
                        "{}: --size {sz} is larger than the device ({} MiB)",
                        a.image.display(),
                        d.block_count() / 256
                    ),
                    8,
                );
            }
            if bytes / 4096 > d.block_count() {
                drop(d);
                match FileDevice::create(&a.image, bytes / 4096 * 4096) {
                    Ok(d) => Arc::new(d),
                    Err(e) => return fail(format!("{}: {e}", a.image.display()), 8),
                }
            } else {
                Arc::new(d)
            }
        } else {
            Arc::new(d)
        }
    } else {
        let bytes = match &a.size {
            Some(sz) => match parse_size(sz) {
                Some(b) => b,
                None => return fail(format!("bad size {sz:?}"), 8),
            },
            None => 1 << 30,
        };
        match FileDevice::create(&a.image, bytes / 4096 * 4096) {
            Ok(d) => Arc::new(d),
            Err(e) => return fail(format!("{}: {e}", a.image.display()), 8),
        }
    };
    if exists && !a.force {
        match dxfs::block::probe(&*dev) {
            Ok(None) => {}
            Ok(Some(what)) => {
                return fail(format!("{} holds {what}; use --force to overwrite it", a.image.display()), 8)
            }
            Err(e) => return fail(format!("{}: {e}", a.image.display()), 8),
        }
    }
    let o = MkfsOptions {
        label: a.label,
        hash,
        seed,
        uuid: None,
        region_blocks: a.region_blocks,
        xattr_filter: !a.no_xattr_filter,
        filter_hashes: a.xattr_filter_hashes,
        log_blocks: None,
        root_owner,
        lazy_inode_free: !a.no_lazy_inode_free,
        rstats: !a.no_rstats,
        mount_mark: !a.no_mount_mark,
        one_flush_commit: !a.no_one_flush_commit,
    };
    match mkfs(dev.clone(), &o) {
        Ok(sb) => {
            println!(
                "dxfs volume on {}: {} blocks of 4 KiB ({} MiB), hash {} seed {}, uuid {}",
                a.image.display(),
                sb.layout.block_count,
                sb.layout.block_count / 256,
                sb.hash.name(),
                format_seed(sb.hash_seed),
                uuid::Uuid::from_bytes(sb.uuid)
            );
            let code = match &a.root_dir {
                Some(d) => super::export::populate(dev.clone(), d),
                None => 0,
            };
            if code == 0 {
                super::known::record_checked(&a.image.to_string_lossy(), &*dev);
            }
            code
        }
        Err(e) => fail(format!("mkfs failed: {e}"), 8),
    }
}
