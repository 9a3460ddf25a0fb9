//! The `dxfs` command: mkfs, fsck, info, mount, debug. Thin: parsing and printing only.
#![forbid(unsafe_code)]

mod cli;

fn main() {
    std::process::exit(cli::run(std::env::args_os().collect()));
}
