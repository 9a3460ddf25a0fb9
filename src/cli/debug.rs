//! `dxfs debug`: inspection aids.

use clap::Subcommand;
use dxfs::hash::{ext4_hash, parse_seed, HashVersion};

use super::fail;

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
}

pub fn run(cmd: DebugCmd) -> i32 {
    match cmd {
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
