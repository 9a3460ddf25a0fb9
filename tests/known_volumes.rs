//! This host's record of the volumes it left (`KnownVolumes`): what makes a volume "as
//! this host left it", and what does not.

mod common;

use std::sync::Arc;

use common::assert_clean;
use dxfs::block::{BlockDevice, MemDevice};
use dxfs::{mkfs, KnownEntry, KnownVolumes, MkfsOptions, OpenOptions, Standing, Volume};

/// An address spelled as an NBD export: no file to take a ctime from, so the
/// fingerprint alone decides.
const SOURCE: &str = "nbd+unix:///known?socket=/nonexistent";

fn unknown(s: Standing) -> String {
    match s {
        Standing::Unknown(why) => why,
        other => panic!("not unknown: {other:?}"),
    }
}

fn open(dev: &Arc<MemDevice>, known: Option<KnownEntry>, read_only: bool) -> Volume {
    Volume::open(dev.clone(), OpenOptions { known, read_only, ..Default::default() }).expect("open")
}

#[test]
fn a_volume_is_as_left_until_anything_opens_it_for_writing_without_recording() {
    let dir = tempfile::tempdir().unwrap();
    let k = KnownVolumes::new(dir.path().join("known"));
    let entry = Some(KnownEntry { volumes: k.clone(), source: SOURCE.into() });
    let dev = Arc::new(MemDevice::new(8192));
    mkfs(dev.clone(), &MkfsOptions::default()).unwrap();
    assert!(unknown(k.standing(SOURCE, &*dev).unwrap()).contains("no record"));
    // Recorded as checked (what fsck and mkfs do): as left.
    assert!(k.record_closed(SOURCE, &*dev).unwrap());
    assert_eq!(k.standing(SOURCE, &*dev).unwrap(), Standing::AsLeft);
    // Another spelling of the source is another record.
    assert!(unknown(k.standing("nbd+unix:///other?socket=/x", &*dev).unwrap()).contains("no record"));

    // A read-only open and a read-only check change nothing.
    let vol = open(&dev, None, true);
    assert!(vol.readdir(vol.root(), 0, 100).is_ok());
    drop(vol);
    assert_clean(dev.clone());
    assert_eq!(k.standing(SOURCE, &*dev).unwrap(), Standing::AsLeft);

    // An open that records: while it holds the volume, the volume is in use; once it is
    // closed, as left, with what it wrote.
    let vol = open(&dev, entry.clone(), false);
    vol.create(vol.root(), b"recorded", 0o644, 0, 0).unwrap();
    assert!(matches!(k.standing(SOURCE, &*dev).unwrap(), Standing::InUse(who) if who.contains("this host")));
    vol.close().unwrap();
    assert_eq!(k.standing(SOURCE, &*dev).unwrap(), Standing::AsLeft);

    // A writer that keeps no record (another host, a program embedding the library):
    // even one that changes nothing moves the mark, and the volume is no longer as left.
    let vol = open(&dev, None, false);
    vol.close().unwrap();
    assert!(unknown(k.standing(SOURCE, &*dev).unwrap()).contains("changed since this host closed it"));
    let vol = open(&dev, entry.clone(), false);
    vol.create(vol.root(), b"again", 0o644, 0, 0).unwrap();
    vol.close().unwrap();
    assert_eq!(k.standing(SOURCE, &*dev).unwrap(), Standing::AsLeft);

    // A raw change of a block the fingerprint covers (here the state block) is seen; a
    // damaged record is not trusted.
    let mut b = vec![0u8; 4096];
    dev.read(1, &mut b).unwrap();
    b[4000] ^= 1;
    dev.write(1, &b).unwrap();
    assert!(matches!(k.standing(SOURCE, &*dev).unwrap(), Standing::Unknown(_)));
    b[4000] ^= 1;
    dev.write(1, &b).unwrap();
    assert_eq!(k.standing(SOURCE, &*dev).unwrap(), Standing::AsLeft);
    for f in std::fs::read_dir(k.dir()).unwrap() {
        std::fs::write(f.unwrap().path(), "dxfs-known 1\nclosed nothex\n").unwrap();
    }
    assert!(unknown(k.standing(SOURCE, &*dev).unwrap()).contains("unreadable"));
    assert_clean(dev.clone());
}
