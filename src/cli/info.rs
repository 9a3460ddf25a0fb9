//! `dxfs info`: the superblock and usage, like `dumpe2fs -h`.

use std::path::PathBuf;

use dxfs::block::open_device;
use dxfs::hash::format_seed;
use dxfs::read_superblock;

use super::fail;

#[derive(clap::Args)]
pub struct InfoArgs {
    /// Image file, block device, or NBD export (nbd://..., nbd+unix://...).
    image: PathBuf,
    /// Machine-readable output.
    #[arg(long)]
    json: bool,
}

pub fn run(a: InfoArgs) -> i32 {
    let dev = match open_device(&a.image.to_string_lossy(), true) {
        Ok(d) => d,
        Err(e) => return fail(format!("{}: {e}", a.image.display()), 8),
    };
    let sb = match read_superblock(&*dev) {
        Ok(s) => s,
        Err(e) => return fail(format!("{}: {e}", a.image.display()), 8),
    };
    let mark = dxfs::mount_mark_status(&*dev).unwrap_or_else(|e| Some(format!("cannot be read: {e}")));
    let vol = match dxfs::Volume::open(dev, dxfs::OpenOptions { read_only: true, ..Default::default() }) {
        Ok(v) => Some(v),
        Err(e) => {
            eprintln!("dxfs: cannot open the volume for usage figures: {e}");
            None
        }
    };
    let sf = vol.as_ref().map(|v| v.statfs());
    let l = sb.layout;
    let uuid = uuid::Uuid::from_bytes(sb.uuid).to_string();
    if a.json {
        let j = serde_json::json!({
            "version": sb.version,
            "uuid": uuid,
            "label": sb.label,
            "block_size": 4096,
            "block_count": l.block_count,
            "log_blocks_per_area": l.log_blocks,
            "bitmap_start": l.bitmap_start,
            "bitmap_blocks": l.bitmap_blocks,
            "bitmap_blocks_in_data_area": l.bitmap_count() - l.bitmap_blocks,
            "root_ino": sb.root_ino,
            "hash": sb.hash.name(),
            "hash_seed": format_seed(sb.hash_seed),
            "region_blocks": sb.region_blocks,
            "features": {"compat": sb.compat, "incompat": sb.incompat, "ro_compat": sb.ro_compat,
                         "xattr_filter": sb.xattr_filter(), "lazy_inode_free": sb.lazy_inode_free(),
                         "mount_mark": sb.mount_mark(), "rstats": sb.rstats(),
                         "bitmap_counts": sb.bitmap_counts(), "dir_quota": sb.dir_quota()},
            "mount_mark_block": sb.mount_mark().then_some(l.mark_block),
            "mount_mark": mark,
            "xattr_filter_hashes": if sb.xattr_filter() { Some(sb.filter_hashes()) } else { None },
            "mkfs_time": sb.mkfs_time,
            "free_blocks": sf.map(|s| s.bfree),
            "available_blocks": sf.map(|s| s.bavail),
            "inodes": sf.map(|s| s.files - s.ffree),
        });
        println!("{}", serde_json::to_string_pretty(&j).unwrap_or_default());
    } else {
        println!("Filesystem volume name:   {}", if sb.label.is_empty() { "<none>" } else { &sb.label });
        println!("Filesystem UUID:          {uuid}");
        println!("Format version:           {}", sb.version);
        println!(
            "Features:                 compat {:#x}{} ro_compat {:#x}{}{}{}{}{}{}{} incompat {:#x}{}",
            sb.compat,
            if sb.compat & 1 != 0 { " (dir_reservation)" } else { "" },
            sb.ro_compat,
            if sb.xattr_filter() { " (xattr_filter)" } else { "" },
            if sb.lazy_inode_free() { " (lazy_inode_free)" } else { "" },
            if sb.mount_mark() { " (mount_mark)" } else { "" },
            if sb.rstats() { " (rstats)" } else { "" },
            if sb.bitmap_counts() { " (bitmap_counts)" } else { "" },
            if sb.dir_quota() { " (dir_quota)" } else { "" },
            if sb.grow_from != 0 {
                format!(" (grow_pending from {} blocks: the next read-write open finishes it)", sb.grow_from)
            } else {
                String::new()
            },
            sb.incompat,
            if sb.incompat & 1 != 0 { " (spilled_bitmap)" } else { "" }
        );
        if sb.xattr_filter() {
            println!("Xattr filter:             {} bits per name of 32", sb.filter_hashes());
        }
        println!("Block size:               4096");
        println!("Block count:              {}", l.block_count);
        println!("Log areas:                2 x {} blocks at {}", l.log_blocks, l.log_area(0));
        let spilled = l.bitmap_count() - l.bitmap_blocks;
        println!(
            "Bitmap:                   {} blocks at {}{}",
            l.bitmap_blocks,
            l.bitmap_start,
            if spilled > 0 { format!(", {spilled} more in the data area (grown volume)") } else { String::new() }
        );
        if let Some(m) = &mark {
            println!("Mount mark:               block {}, {m}", l.mark_block);
        }
        println!("Root inode:               {}", sb.root_ino);
        println!("Directory hash:           {}", sb.hash.name());
        println!("Directory hash seed:      {}", format_seed(sb.hash_seed));
        println!("Inode region (blocks):    {}", sb.region_blocks);
        if let Some(s) = sf {
            println!("Free blocks:              {}", s.bfree);
            println!("Available blocks:         {}", s.bavail);
            println!("Inodes in use:            {}", s.files - s.ffree);
        }
    }
    0
}
