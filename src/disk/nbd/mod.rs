//! An NBD client as a [`BlockDevice`]: the volume on any server that speaks the Network
//! Block Device protocol (nbdkit, qemu-nbd, rbd-nbd, nbd-server), with no kernel module.
//!
//! Written to the protocol document (NetworkBlockDevice/nbd, `doc/proto.md`):
//!
//! - **Handshake**: fixed newstyle only; `NBD_OPT_GO` with the export name asking for
//!   `NBD_INFO_BLOCK_SIZE` (the reply's `NBD_INFO_EXPORT` gives size and transmission
//!   flags); a server that answers `NBD_REP_ERR_UNSUP` gets `NBD_OPT_EXPORT_NAME`
//!   instead. Every option error becomes a sentence naming the server and export.
//! - **Transmission**: READ, WRITE (with FUA for [`BlockDevice::write_durable`] if
//!   offered), FLUSH (if offered), TRIM (if offered), DISC on drop; simple replies, and
//!   structured ones (data, hole and error chunks) when the server agrees to them.
//!   Several connections when the server allows multi-conn, requests routed by 1 MiB
//!   region, a reader thread each. Any number of requests are in flight on the one connection: callers
//!   write requests under a send lock, one reader thread reads the replies and hands each
//!   to its caller by cookie. [`BlockDevice::read_many`] puts a whole batch in flight
//!   before waiting for the first reply.
//! - **Flush**: waits until every write and trim issued before it has been acknowledged,
//!   then sends `NBD_CMD_FLUSH` (the protocol only covers writes already replied to).
//! - **Faults**: a dropped or stalled connection (no reply for `timeout` while requests
//!   wait) is reconnected with back-off; writes acknowledged since the last flush are
//!   written again, one at a time and in order, then every request still waiting is sent
//!   again (block writes are idempotent). If no connection comes back within `timeout`,
//!   every waiting request fails with EIO and one `error!` line says why; new requests
//!   fail at once until a later reconnection succeeds. A server's error reply fails that
//!   request only. If more acknowledged-unflushed data was lost with a connection than
//!   the client kept for replay, the next flush fails, so no commit can claim it durable.
//!
//! One file per job: `uri.rs` parses the address, `stream.rs` is the socket (TCP or
//! Unix), `handshake.rs` opens a connection and negotiates the export, `proto.rs` holds
//! the wire format, `transmission.rs` is the table of requests in flight (sent, matched
//! by cookie, completed), `reader.rs` reads one connection's replies, `supervisor.rs`
//! runs the readers and reconnects, `readahead.rs` serves sequential large reads ahead
//! of the caller, and `device.rs` is the `BlockDevice` built on them.
//!
//! [`BlockDevice`]: crate::disk::device::BlockDevice
//! [`BlockDevice::write_durable`]: crate::disk::device::BlockDevice::write_durable
//! [`BlockDevice::read_many`]: crate::disk::device::BlockDevice::read_many

mod device;
mod handshake;
mod proto;
mod readahead;
mod reader;
mod stream;
mod supervisor;
mod transmission;
mod uri;

use std::fmt;
use std::io;

use crate::disk::codec::BLOCK_SIZE;
use crate::error::Error;

pub use device::NbdDevice;
pub use uri::{is_nbd_uri, NbdEndpoint, NbdTarget};

const BS: u64 = BLOCK_SIZE as u64;

fn eio(msg: impl fmt::Display) -> Error {
    Error::Io(io::Error::other(msg.to_string()))
}
