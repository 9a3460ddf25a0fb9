//! The wire format against requests and replies built byte by byte.

use super::*;

/// A request as the kernel lays it out on `/dev/fuse`, built byte by byte.
fn classic(opcode: u8, unique: u8, nodeid: u8, body: &[u8]) -> Vec<u8> {
    let len = (40 + body.len()) as u8;
    let mut v = vec![
        len, 0, 0, 0, opcode, 0, 0, 0, // len, opcode
        unique, 0, 0, 0, 0, 0, 0, 0, // unique
        nodeid, 0, 0, 0, 0, 0, 0, 0, // nodeid
        0xe8, 0x03, 0, 0, 0xe9, 0x03, 0, 0, // uid 1000, gid 1001
        0x39, 0x30, 0, 0, 0, 0, 0, 0, // pid 12345, total_extlen 0, padding
    ];
    v.extend_from_slice(body);
    v
}

#[test]
fn in_header_fields_at_their_offsets() {
    let b = classic(1, 7, 1, b"abc\0");
    let h = InHeader::parse(&b).unwrap();
    assert_eq!(
        h,
        InHeader { len: 44, opcode: 1, unique: 7, nodeid: 1, uid: 1000, gid: 1001, pid: 12345, total_extlen: 0 }
    );
    let mut again = Vec::new();
    h.encode(&mut again);
    assert_eq!(again, b[..40]);
    assert!(matches!(InHeader::parse(&b[..39]), Err(WireError::Short { need: 40, have: 39, .. })));
}

#[test]
fn lookup_and_unlink_names() {
    let b = classic(1, 2, 1, b"hello\0");
    let (h, arg, rest) = split_classic(&b).unwrap();
    assert!(arg.is_empty());
    assert_eq!(Request::parse(h.opcode, arg, rest).unwrap(), Request::Lookup { name: b"hello" });
    let b = classic(10, 3, 1, b"x\0");
    let (h, arg, rest) = split_classic(&b).unwrap();
    assert_eq!(Request::parse(h.opcode, arg, rest).unwrap(), Request::Unlink { name: b"x" });
    let b = classic(1, 2, 1, b"nonul");
    let (h, arg, rest) = split_classic(&b).unwrap();
    assert_eq!(Request::parse(h.opcode, arg, rest), Err(WireError::NoNul("LOOKUP")));
}

#[test]
fn length_mismatch_is_an_error() {
    let mut b = classic(1, 2, 1, b"a\0");
    b.push(0);
    assert_eq!(split_classic(&b), Err(WireError::BadLength { header: 42, read: 43 }));
}

#[test]
fn extension_headers_are_cut_off() {
    let mut b = classic(10, 3, 1, b"x\0\0\0\0\0\0\0");
    b.extend_from_slice(&[0xaa; 8]);
    b[0] = 56; // len
    b[36] = 1; // total_extlen: 8 bytes
    let (_, _, rest) = split_classic(&b).unwrap();
    assert_eq!(rest.len(), 8);
    assert!(!rest.contains(&0xaa));
}

#[test]
fn create_splits_fixed_argument_from_name() {
    let body = [
        0xc1, 0x00, 0x00, 0x00, // flags O_CREAT|O_EXCL|O_WRONLY = 0o301
        0xa4, 0x81, 0x00, 0x00, // mode 0o100644
        0x12, 0x00, 0x00, 0x00, // umask 0o22
        0, 0, 0, 0, // open_flags
        b'f', b'0', 0,
    ];
    let b = classic(35, 9, 1, &body);
    let (h, arg, rest) = split_classic(&b).unwrap();
    assert_eq!(arg.len(), 16);
    assert_eq!(
        Request::parse(h.opcode, arg, rest).unwrap(),
        Request::Create { flags: 0o301, mode: 0o100644, umask: 0o22, name: b"f0" }
    );
    // FUSE over io_uring delivers the same request with arg in op_in and the name
    // in the payload: the same parse.
    assert_eq!(
        Request::parse(35, &body[..16], b"f0\0").unwrap(),
        Request::Create { flags: 0o301, mode: 0o100644, umask: 0o22, name: b"f0" }
    );
    assert!(matches!(Request::parse(35, &body[..15], b"f0\0"), Err(WireError::Short { need: 16, .. })));
}

#[test]
fn write_read_flush_release_getattr() {
    let mut w = vec![
        5, 0, 0, 0, 0, 0, 0, 0, // fh 5
        0, 0x10, 0, 0, 0, 0, 0, 0, // offset 4096
        3, 0, 0, 0, 1, 0, 0, 0, // size 3, write_flags 1
    ];
    w.extend_from_slice(&[0; 8]); // lock_owner
    w.extend_from_slice(&[0, 0x40, 0, 0, 0, 0, 0, 0]); // flags O_DIRECT, padding
    w.extend_from_slice(b"xyz");
    let b = classic(16, 1, 2, &w);
    let (h, arg, rest) = split_classic(&b).unwrap();
    assert_eq!(
        Request::parse(h.opcode, arg, rest).unwrap(),
        Request::Write { fh: 5, offset: 4096, write_flags: 1, flags: 0x4000, data: b"xyz" }
    );
    assert!(matches!(Request::parse(16, arg, b"xy"), Err(WireError::Short { what: "WRITE data", .. })));

    let mut r = vec![5, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x10, 0, 0, 0, 0, 0, 0];
    r.extend_from_slice(&[0; 16]);
    assert_eq!(Request::parse(15, &r, &[]).unwrap(), Request::Read { fh: 5, offset: 0, size: 4096, flags: 0 });
    // The reader's open flags at offset 32 (O_DIRECT here); a request of the oldest
    // protocols, without them, reads as flags 0.
    r[32..36].copy_from_slice(&0o40000u32.to_le_bytes());
    assert_eq!(Request::parse(15, &r, &[]).unwrap(), Request::Read { fh: 5, offset: 0, size: 4096, flags: 0o40000 });
    assert_eq!(Request::parse(15, &r[..24], &[]).unwrap(), Request::Read { fh: 5, offset: 0, size: 4096, flags: 0 });

    let f = [6, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0];
    assert_eq!(Request::parse(25, &f, &[]).unwrap(), Request::Flush { fh: 6, lock_owner: 9 });
    let rel = [6, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    assert_eq!(Request::parse(18, &rel, &[]).unwrap(), Request::Release { fh: 6, flags: 2, release_flags: 1 });
    let g = [1, 0, 0, 0, 0, 0, 0, 0, 6, 0, 0, 0, 0, 0, 0, 0];
    assert_eq!(Request::parse(3, &g, &[]).unwrap(), Request::Getattr { flags: GETATTR_FH, fh: 6 });
    // fuse_statx_in: getattr_flags, reserved, fh, sx_flags, sx_mask (STATX_BTIME).
    let sx = [&g[..], &[0, 0, 0, 0], &0x800u32.to_le_bytes()].concat();
    assert_eq!(Request::parse(52, &sx, &[]).unwrap(), Request::Statx { flags: GETATTR_FH, fh: 6, mask: 0x800 });
    assert!(matches!(Request::parse(52, &g, &[]), Err(WireError::Short { what: "fuse_statx_in", .. })));
}

#[test]
fn getxattr_forgets_interrupt_statfs_destroy() {
    let b = classic(22, 4, 2, &[0, 0, 0, 0, 0, 0, 0, 0, b'u', b'.', b'f', 0]);
    let (h, arg, rest) = split_classic(&b).unwrap();
    assert_eq!(Request::parse(h.opcode, arg, rest).unwrap(), Request::Getxattr { size: 0, name: b"u.f" });

    let f = Request::parse(2, &[3, 0, 0, 0, 0, 0, 0, 0], &[]).unwrap();
    assert_eq!(f, Request::Forget { nlookup: 3 });
    assert!(f.no_reply());

    let mut rest = vec![7, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0];
    rest.extend_from_slice(&[8, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0]);
    let bf = Request::parse(42, &[2, 0, 0, 0, 0, 0, 0, 0], &rest).unwrap();
    assert_eq!(bf, Request::BatchForget(vec![(7, 1), (8, 2)]));
    assert!(bf.no_reply());
    // A count larger than the entries sent.
    assert!(Request::parse(42, &[3, 0, 0, 0, 0, 0, 0, 0], &rest).is_err());

    assert_eq!(Request::parse(36, &[9, 0, 0, 0, 0, 0, 0, 0], &[]).unwrap(), Request::Interrupt { unique: 9 });
    assert_eq!(Request::parse(17, &[], &[]).unwrap(), Request::Statfs);
    assert_eq!(Request::parse(38, &[], &[]).unwrap(), Request::Destroy);
    // SYNCFS: its padding may be there or not.
    assert_eq!(Request::parse(50, &[0; 8], &[]).unwrap(), Request::Syncfs);
    assert_eq!(Request::parse(50, &[], &[]).unwrap(), Request::Syncfs);
    assert_eq!(Request::parse(99, &[], &[]).unwrap(), Request::Other(99));
    assert!(!Request::Statfs.no_reply());
}

#[test]
fn init_in_merges_flags2_only_with_init_ext() {
    let mut b = vec![
        7, 0, 0, 0, 44, 0, 0, 0, // 7.44
        0, 0, 2, 0, // max_readahead 128 KiB
        0x01, 0x00, 0x00, 0x40, // flags: ASYNC_READ | INIT_EXT
        0x00, 0x02, 0x00, 0x00, // flags2: bit 9 = OVER_IO_URING (1 << 41)
    ];
    b.resize(64, 0);
    let i = InitIn::parse(&b).unwrap();
    assert_eq!((i.major, i.minor, i.max_readahead), (7, 44, 131072));
    assert_eq!(i.flags, init::ASYNC_READ | init::INIT_EXT | init::OVER_IO_URING);
    b[15] = 0; // no INIT_EXT: flags2 is not read
    assert_eq!(InitIn::parse(&b).unwrap().flags, init::ASYNC_READ);
    assert_eq!(InitIn::parse(&b[..16]).unwrap().flags, init::ASYNC_READ);
    assert!(InitIn::parse(&b[..15]).is_err());
    let req = classic(26, 1, 0, &b);
    let (h, arg, _) = split_classic(&req).unwrap();
    assert_eq!((h.opcode, arg.len()), (26, 64));
}

#[test]
fn init_out_layout() {
    let o = InitOut {
        major: 7,
        minor: 42,
        max_readahead: 0x20000,
        flags: init::INIT_EXT | init::OVER_IO_URING | init::MAX_PAGES,
        max_background: 16,
        congestion_threshold: 12,
        max_write: 0x20000,
        time_gran: 1,
        max_pages: 32,
    };
    let mut v = Vec::new();
    o.encode(&mut v);
    let want: Vec<u8> = [
        &[7, 0, 0, 0, 42, 0, 0, 0][..],
        &[0, 0, 2, 0],
        &[0, 0, 0x40, 0x40], // flags: MAX_PAGES (1 << 22) | INIT_EXT (1 << 30)
        &[16, 0, 12, 0],
        &[0, 0, 2, 0],
        &[1, 0, 0, 0],
        &[32, 0, 0, 0], // max_pages, map_alignment
        &[0, 2, 0, 0],  // flags2: OVER_IO_URING >> 32 = 1 << 9
        &[0; 4],        // max_stack_depth
        &[0; 24],       // request_timeout, unused
    ]
    .concat();
    assert_eq!(v, want);
}

#[test]
fn entry_attr_open_statfs_replies() {
    let attr = Attr { ino: 2, size: 3, mode: 0o100644, nlink: 1, blksize: 4096, ..Attr::default() };
    let mut e = Vec::new();
    EntryOut {
        nodeid: 2,
        generation: 1,
        entry_valid: Valid { secs: 1, nsecs: 5 },
        attr_valid: Valid::from(std::time::Duration::from_millis(1500)),
        attr,
    }
    .encode(&mut e);
    assert_eq!(e.len(), 128);
    assert_eq!(&e[..8], &[2, 0, 0, 0, 0, 0, 0, 0]);
    assert_eq!(&e[16..24], &[1, 0, 0, 0, 0, 0, 0, 0]); // entry_valid
    assert_eq!(&e[24..32], &[1, 0, 0, 0, 0, 0, 0, 0]); // attr_valid 1 s
    assert_eq!(&e[32..36], &[5, 0, 0, 0]);
    assert_eq!(&e[36..40], &500_000_000u32.to_le_bytes()); // attr_valid_nsec
    assert_eq!(&e[40..48], &[2, 0, 0, 0, 0, 0, 0, 0]); // attr.ino
    assert_eq!(&e[40 + 60..40 + 64], &[0xa4, 0x81, 0, 0]); // attr.mode at 60
    assert_eq!(&e[40 + 80..40 + 84], &[0, 0x10, 0, 0]); // attr.blksize at 80

    let mut a = Vec::new();
    AttrOut { attr_valid: Valid { secs: 0, nsecs: 0 }, attr }.encode(&mut a);
    assert_eq!(a.len(), 104);
    assert_eq!(&a[16..24], &[2, 0, 0, 0, 0, 0, 0, 0]);

    // struct fuse_statx_out: 32 bytes, then struct fuse_statx.
    let times = Attr { atime: 10, atimensec: 11, ctime: 30, ctimensec: 31, mtime: 40, mtimensec: 41, ..attr };
    let mut x = Vec::new();
    let btime = ((-5i64) as u64, 21);
    StatxOut { attr_valid: Valid { secs: 7, nsecs: 8 }, attr: times, btime, rdev_major: 4, rdev_minor: 5 }
        .encode(&mut x);
    assert_eq!(x.len(), 288);
    assert_eq!(&x[..12], &[7, 0, 0, 0, 0, 0, 0, 0, 8, 0, 0, 0]); // attr_valid, _nsec
    let st = &x[32..];
    assert_eq!(&st[..8], &[0xff, 0x0f, 0, 0, 0, 0x10, 0, 0]); // mask, blksize
    assert_eq!(&st[16..20], &[1, 0, 0, 0]); // nlink
    assert_eq!(&st[28..30], &[0xa4, 0x81]); // mode (u16)
    assert_eq!(&st[32..40], &[2, 0, 0, 0, 0, 0, 0, 0]); // ino
    assert_eq!(&st[40..48], &[3, 0, 0, 0, 0, 0, 0, 0]); // size

    // atime, btime, ctime, mtime: 16 bytes each from 64.
    for (k, (secs, nsecs)) in [(10i64, 11u32), (-5, 21), (30, 31), (40, 41)].into_iter().enumerate() {
        let t = &st[64 + 16 * k..80 + 16 * k];
        assert_eq!(&t[..8], &secs.to_le_bytes(), "time {k}");
        assert_eq!(&t[8..12], &nsecs.to_le_bytes(), "time {k}");
    }
    assert_eq!(&st[128..136], &[4, 0, 0, 0, 5, 0, 0, 0]); // rdev_major, rdev_minor
    assert!(st[136..].iter().all(|&b| b == 0));

    let mut o = Vec::new();
    OpenOut { fh: 0x0102, open_flags: 4 }.encode(&mut o);
    assert_eq!(o, [2, 1, 0, 0, 0, 0, 0, 0, 4, 0, 0, 0, 0, 0, 0, 0]);

    let mut s = Vec::new();
    StatfsOut { blocks: 1, bfree: 2, bavail: 3, files: 4, ffree: 5, bsize: 6, namelen: 7, frsize: 8 }.encode(&mut s);
    assert_eq!(s.len(), 80);
    assert_eq!(s[32], 5);
    assert_eq!(&s[40..52], &[6, 0, 0, 0, 7, 0, 0, 0, 8, 0, 0, 0]);
    assert!(s[52..].iter().all(|&b| b == 0));

    let mut w = Vec::new();
    encode_size_out(3, &mut w);
    assert_eq!(w, [3, 0, 0, 0, 0, 0, 0, 0]);
}

#[test]
fn reply_header() {
    let r = reply(0x0a0b, 0, &[1, 2]);
    assert_eq!(r, [18, 0, 0, 0, 0, 0, 0, 0, 0x0b, 0x0a, 0, 0, 0, 0, 0, 0, 1, 2]);
    // An error carries -errno and no body.
    let r = reply(5, libc::ENODATA, &[1, 2]);
    assert_eq!(&r[..8], &[16, 0, 0, 0, 0xc3, 0xff, 0xff, 0xff]); // -61
    assert_eq!(r.len(), 16);
    assert_eq!(OutHeader::parse(&r).unwrap(), OutHeader { len: 16, error: -61, unique: 5 });
}

fn le(parts: &[&[u8]]) -> Vec<u8> {
    parts.concat()
}

#[test]
fn namespace_requests_with_two_names_or_an_argument() {
    assert_eq!(
        Request::parse(opcode::SYMLINK, &[], b"ln\0target/x\0").unwrap(),
        Request::Symlink { name: b"ln", target: b"target/x" }
    );
    assert_eq!(Request::parse(opcode::SYMLINK, &[], b"ln\0target"), Err(WireError::NoNul("SYMLINK")));
    let r2 = le(&[&9u64.to_ne_bytes(), &1u32.to_ne_bytes(), &[0; 4]]);
    assert_eq!(
        Request::parse(opcode::RENAME2, &r2, b"a\0b\0").unwrap(),
        Request::Rename { newdir: 9, flags: 1, name: b"a", newname: b"b" }
    );
    assert_eq!(
        Request::parse(opcode::RENAME, &9u64.to_ne_bytes(), b"a\0b\0").unwrap(),
        Request::Rename { newdir: 9, flags: 0, name: b"a", newname: b"b" }
    );
    assert_eq!(
        Request::parse(opcode::LINK, &5u64.to_ne_bytes(), b"n\0").unwrap(),
        Request::Link { oldnodeid: 5, name: b"n" }
    );
    let mk = le(&[&0o40755u32.to_ne_bytes(), &0o22u32.to_ne_bytes()]);
    assert_eq!(
        Request::parse(opcode::MKDIR, &mk, b"d\0").unwrap(),
        Request::Mkdir { mode: 0o40755, umask: 0o22, name: b"d" }
    );
    let tmp = le(&[&2u32.to_ne_bytes(), &0o100600u32.to_ne_bytes(), &0o77u32.to_ne_bytes(), &[0; 4]]);
    assert_eq!(
        Request::parse(opcode::TMPFILE, &tmp, b"/\0").unwrap(),
        Request::Tmpfile { flags: 2, mode: 0o100600, umask: 0o77 }
    );
}

#[test]
fn setattr_xattr_readdir_fallocate_copy() {
    let mut sa = vec![0u8; 88];
    sa[0..4].copy_from_slice(&(fattr::MODE | fattr::SIZE | fattr::MTIME).to_ne_bytes());
    sa[16..24].copy_from_slice(&4096u64.to_ne_bytes());
    sa[40..48].copy_from_slice(&(-5i64).to_ne_bytes());
    sa[60..64].copy_from_slice(&7u32.to_ne_bytes());
    sa[68..72].copy_from_slice(&0o100644u32.to_ne_bytes());
    let Request::Setattr(s) = Request::parse(opcode::SETATTR, &sa, &[]).unwrap() else { panic!() };
    assert_eq!((s.size, s.mtime, s.mtimensec, s.mode), (4096, -5, 7, 0o100644));
    assert!(Request::parse(opcode::SETATTR, &sa[..87], &[]).is_err());

    let sx = le(&[&3u32.to_ne_bytes(), &1u32.to_ne_bytes()]);
    assert_eq!(
        Request::parse(opcode::SETXATTR, &sx, b"user.a\0xyzTRAILING").unwrap(),
        Request::Setxattr { flags: 1, name: b"user.a", value: b"xyz" }
    );
    assert!(Request::parse(opcode::SETXATTR, &sx, b"user.a\0xy").is_err(), "value shorter than its size");

    let rd = le(&[&1u64.to_ne_bytes(), &77u64.to_ne_bytes(), &4096u32.to_ne_bytes(), &[0; 12]]);
    assert_eq!(
        Request::parse(opcode::READDIRPLUS, &rd, &[]).unwrap(),
        Request::Readdir { fh: 1, offset: 77, size: 4096, plus: true }
    );
    let fa = le(&[&0u64.to_ne_bytes(), &8u64.to_ne_bytes(), &16u64.to_ne_bytes(), &3u32.to_ne_bytes(), &[0; 4]]);
    assert_eq!(
        Request::parse(opcode::FALLOCATE, &fa, &[]).unwrap(),
        Request::Fallocate { fh: 0, offset: 8, length: 16, mode: 3 }
    );
    let cf: Vec<u8> = [0u64, 10, 42, 0, 20, 30, 0].iter().flat_map(|v| v.to_ne_bytes()).collect();
    assert_eq!(
        Request::parse(opcode::COPY_FILE_RANGE, &cf, &[]).unwrap(),
        Request::CopyFileRange { off_in: 10, nodeid_out: 42, off_out: 20, len: 30 }
    );
}

#[test]
fn dirent_and_notification_layout() {
    let mut out = Vec::new();
    encode_dirent(&mut out, 5, 9, 8, b"abc");
    assert_eq!(out.len(), 32, "24 bytes and the name, padded to 8");
    assert_eq!(out.len(), dirent_size(3, false));
    assert_eq!(dirent_size(3, true), 128 + 32);
    assert_eq!(&out[0..8], &5u64.to_ne_bytes());
    assert_eq!(&out[8..16], &9u64.to_ne_bytes());
    assert_eq!(&out[16..20], &3u32.to_ne_bytes());
    assert_eq!(&out[20..24], &8u32.to_ne_bytes());
    assert_eq!(&out[24..27], b"abc");
    assert_eq!(&out[27..], &[0; 5]);
    let n = notify_inval_inode(7, 4096, -1);
    let h = OutHeader::parse(&n).unwrap();
    assert_eq!((h.len as usize, h.error, h.unique), (n.len(), 2, 0));
    assert_eq!(&n[16..24], &7u64.to_ne_bytes());
    assert_eq!(&n[32..40], &(-1i64).to_ne_bytes());
}

#[test]
fn uring_command_and_entry_header() {
    let c = uring::CmdReq { flags: 0, commit_id: 0x1122, qid: 1 }.encode();
    assert_eq!(&c[..18], &[0, 0, 0, 0, 0, 0, 0, 0, 0x22, 0x11, 0, 0, 0, 0, 0, 0, 1, 0]);
    assert!(c[18..].iter().all(|&b| b == 0));

    let mut e = Vec::new();
    uring::EntInOut { flags: 0, commit_id: 77, payload_sz: 3 }.encode(&mut e);
    assert_eq!(e.len(), uring::EntInOut::SIZE);
    assert_eq!(&e[8..20], &[77, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0]);
    assert_eq!(uring::EntInOut::parse(&e).unwrap().payload_sz, 3);
    assert_eq!(
        uring::ENT_IN_OUT_OFFSET + uring::EntInOut::SIZE,
        uring::HEADER_SIZE,
        "in_out[128] + op_in[128] + ent_in_out"
    );
    assert_eq!(uring::payload_size(0x20000, 32, 4096), 0x20000);
    assert_eq!(uring::payload_size(4096, 0, 4096), 32 * 4096);
    assert_eq!(uring::payload_size(4096, 1, 4096), 8192);
}
