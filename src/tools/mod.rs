//! Offline tools at fsck's layer: they read (and later write) a volume through the same
//! layers fsck does. [`inspect`] is the read-only inspector behind `dxfs debug`.

pub mod inspect;
