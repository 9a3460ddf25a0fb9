mod common;
use common::*;
use dxfs::Error;

#[test]
fn create_write_read_reopen() {
    let (dev, vol) = mem_volume(8192);
    let root = vol.root();
    let f = vol.create(root, b"a", 0o644, 1, 2).unwrap();
    vol.write(f.ino, 0, b"hello").unwrap();
    assert_eq!(vol.read(f.ino, 0, 100).unwrap(), b"hello");
    let d = vol.mkdir(root, b"d", 0o755, 0, 0).unwrap();
    for i in 0..500 {
        vol.create(d.ino, format!("f{i}").as_bytes(), 0o600, 0, 0).unwrap();
    }
    assert!(matches!(vol.create(d.ino, b"f7", 0o600, 0, 0), Err(Error::Exists)));
    vol.sync().unwrap();
    close_and_check(dev.clone(), vol);
    let vol = dxfs::Volume::open(dev.clone(), Default::default()).unwrap();
    assert_eq!(vol.read(f.ino, 0, 100).unwrap(), b"hello");
    let d2 = vol.lookup(root, b"d").unwrap();
    assert_eq!(vol.readdir(d2.ino, 0, 10000).unwrap().len(), 502);
    for i in 0..500 {
        vol.unlink(d.ino, format!("f{i}").as_bytes()).unwrap();
    }
    assert_eq!(vol.dir_stats(d.ino).unwrap(), (0, 0));
    vol.rmdir(root, b"d").unwrap();
    close_and_check(dev, vol);
}
