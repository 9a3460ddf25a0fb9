//! The `dxfs` command: mkfs, fsck, info, mount, debug. Thin: parsing and printing only.
#![forbid(unsafe_code)]

mod cli;

/// The daemon's file data passes through its heap a dirty page at a time: mimalloc keeps
/// and reuses freed pages where glibc's malloc returned them to the kernel and took a
/// page fault for each again (a third of the daemon's time in a sequential write).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    std::process::exit(cli::run(std::env::args_os().collect()));
}
