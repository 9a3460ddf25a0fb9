//! Mounting through fusermount3, the setuid helper, for users other than root: it opens
//! /dev/fuse, mounts, and hands the descriptor back over a socket (SCM_RIGHTS), as
//! libfuse does. fuser gives up when it cannot open /dev/fuse itself (mode 0600 on some
//! systems) instead of asking the helper, so dxfs asks it.
//!
//! The one unsafe line takes ownership of the descriptor the kernel just installed.
#![allow(unsafe_code)]

use std::io::{self, IoSliceMut};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::Command;

use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags, UnixAddr};

/// Run `fusermount3 -o OPTIONS -- MOUNTPOINT` and return the /dev/fuse descriptor of
/// the new mount.
pub(super) fn mount(mountpoint: &Path, options: &str) -> io::Result<OwnedFd> {
    let (ours, theirs) = UnixStream::pair()?;
    // The helper inherits its end (std makes sockets close-on-exec).
    nix::fcntl::fcntl(&theirs, nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty()))?;
    let out = Command::new("fusermount3")
        .arg("-o")
        .arg(options)
        .arg("--")
        .arg(mountpoint)
        .env("_FUSE_COMMFD", theirs.as_raw_fd().to_string())
        .output()
        .map_err(|e| io::Error::new(e.kind(), format!("fusermount3: {e} (is fuse3 installed?)")))?;
    drop(theirs);
    if !out.status.success() {
        let msg = String::from_utf8_lossy(&out.stderr);
        return Err(io::Error::other(format!("fusermount3: {}", msg.trim())));
    }
    receive_fd(&ours)
}

fn receive_fd(sock: &UnixStream) -> io::Result<OwnedFd> {
    let mut byte = [0u8];
    let mut iov = [IoSliceMut::new(&mut byte)];
    let mut space = nix::cmsg_space!(RawFd);
    let msg = loop {
        match recvmsg::<UnixAddr>(sock.as_raw_fd(), &mut iov, Some(&mut space), MsgFlags::MSG_CMSG_CLOEXEC) {
            Ok(m) => break m,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        }
    };
    for c in msg.cmsgs().map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))? {
        if let ControlMessageOwned::ScmRights(fds) = c {
            if let Some(&fd) = fds.first().filter(|fd| **fd >= 0) {
                // SAFETY: SCM_RIGHTS installed `fd` in this process for this message;
                // nothing else refers to it, so it is ours to own and close.
                return Ok(unsafe { OwnedFd::from_raw_fd(fd) });
            }
        }
    }
    Err(io::Error::new(io::ErrorKind::InvalidData, "fusermount3 sent no /dev/fuse descriptor"))
}
