//! `dxfs debug`: inspection aids.

use clap::Subcommand;
use dxfs::hash::{ext4_hash, parse_seed, HashVersion};

use super::fail;
use super::inspect::{self, What};

/// IMAGE PATH and --json, shared by the inspector subcommands.
#[derive(clap::Args)]
pub struct PathArgs {
    /// Image file or block device (opened read-only).
    image: std::path::PathBuf,
    /// Absolute path inside the volume ("/" is the root).
    path: String,
    /// Machine-readable output.
    #[arg(long)]
    json: bool,
}

#[derive(Subcommand)]
pub enum DebugCmd {
    /// Print a name's directory hash, as debugfs's dx_hash does (`-h` is the hash
    /// version here, as in debugfs; use --help for help).
    #[command(disable_help_flag = true)]
    Hash {
        /// Hash version: legacy, half_md4, tea or 0-5.
        #[arg(short = 'h', long = "hash", default_value = "half_md4")]
        version: String,
        /// Seed as a UUID (all zero by default).
        #[arg(short = 's', long, default_value = "00000000-0000-0000-0000-000000000000")]
        seed: String,
        /// Print help.
        #[arg(long, action = clap::ArgAction::Help)]
        help: Option<bool>,
        name: String,
    },
    /// A directory's entries: name, inode, type.
    Ls(PathArgs),
    /// An inode's fields.
    Stat(PathArgs),
    /// A directory's index: depth, leaves, fill per leaf, hash range per leaf.
    Htree(PathArgs),
    /// A file's extent map: logical, physical, length, unwritten.
    Extents(PathArgs),
    /// An inode's xattr names, value lengths, its filter word and each name's bits.
    Xattrs(PathArgs),
    /// One block decoded: what it is (by position and magic), whether its checksum
    /// verifies, whether it is in use, its header fields.
    Block {
        /// Image file or block device (opened read-only).
        image: std::path::PathBuf,
        /// Block number.
        block: u64,
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
    },
    /// Both log areas' commit blocks: valid or not, sequence, blocks logged, the blocks
    /// each delta logs (its targets) and whether its body matches its checksum.
    Log {
        /// Image file or block device (opened read-only).
        image: std::path::PathBuf,
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
    },
}

pub fn run(cmd: DebugCmd) -> i32 {
    let with = |a: PathArgs, w| inspect::run(&a.image, &a.path, w, a.json);
    match cmd {
        DebugCmd::Ls(a) => with(a, What::Ls),
        DebugCmd::Stat(a) => with(a, What::Stat),
        DebugCmd::Htree(a) => with(a, What::Htree),
        DebugCmd::Extents(a) => with(a, What::Extents),
        DebugCmd::Xattrs(a) => with(a, What::Xattrs),
        DebugCmd::Log { image, json } => inspect::run(&image, "/", What::Log, json),
        DebugCmd::Block { image, block, json } => inspect::run(&image, "/", What::Block(block), json),
        DebugCmd::Hash { version, seed, name, .. } => {
            let Some(v) = HashVersion::parse(&version) else {
                return fail(format!("unknown hash version {version:?}"), 8);
            };
            let Some(s) = parse_seed(&seed) else {
                return fail(format!("bad seed {seed:?} (want a UUID)"), 8);
            };
            let (major, minor) = ext4_hash(v, s, name.as_bytes());
            println!("Hash of {name} is {major:#x} (minor {minor:#x})");
            0
        }
    }
}
