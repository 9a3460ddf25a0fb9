//! fsck: check every invariant of a volume, and repair what can be repaired safely.
//!
//! Walks the tree from the root and rebuilds, independently of the allocator, which
//! blocks and inode slots are in use, how many links each inode has and how many blocks
//! each owns; then compares with what the volume says. Exit codes follow e2fsck.

use std::collections::HashMap;
use std::sync::Arc;

use crate::disk::codec::*;
use crate::disk::device::BlockDevice;
use crate::disk::format::*;
use crate::disk::valid::normal_time;
use crate::engine::btree;
use crate::engine::cache::MetaCache;
use crate::engine::space::Space;
use crate::engine::store::Tx;
use crate::error::{Error, Result};
use crate::fs::dir;
use crate::fs::file;
use crate::volume::{mark, read_usable_superblock, Volume};

mod repair;
mod rstats;
mod tally;
mod walk;
use repair::*;
use tally::{Slots, Usage};
use walk::{Drop, InodeFix, LostInode, Tree, Walk};

/// What fsck found.
#[derive(Debug, Default, Clone)]
pub struct Report {
    /// Problems still present.
    pub errors: Vec<String>,
    /// Problems repaired.
    pub fixed: Vec<String>,
    /// Worth saying, but not wrong with the volume (it is in use elsewhere, say).
    pub warnings: Vec<String>,
    pub inodes: u64,
    pub directories: u64,
    pub files: u64,
    pub blocks_used: u64,
    pub blocks_total: u64,
    /// Directory index statistics: leaves and bytes used in them.
    pub dir_leaves: u64,
    pub dir_leaf_bytes: u64,
    /// Damaged structures that follow from the tree (free-space map, state block), found
    /// while opening: rebuilt by a repair (and listed in `fixed`), else errors.
    pub rebuilt: Vec<String>,
}

impl Report {
    /// e2fsck's exit code: 0 clean, 1 errors fixed, 4 errors left.
    pub fn exit_code(&self) -> i32 {
        if !self.errors.is_empty() {
            4
        } else if !self.fixed.is_empty() {
            1
        } else {
            0
        }
    }
}

/// Check (and with `repair`, fix) the volume on `dev`. `progress` gets the number of
/// inodes checked so far.
///
/// A volume with a mount mark (ro_compat MOUNT_MARK): a repair takes the mark for its
/// whole length, so it is refused ([`Error::Busy`]) while another host
/// or process holds the volume; a check without repair says in `warnings` that the volume
/// is in use (what it reads may lag behind the holder's memory).
pub fn check(dev: Arc<dyn BlockDevice>, repair: bool, progress: &mut dyn FnMut(u64)) -> Result<Report> {
    check_with(dev, &CheckOptions { repair, ..Default::default() }, progress)
}

/// How [`check_with`] runs.
#[derive(Clone, Copy, Debug, Default)]
pub struct CheckOptions {
    /// Repair what can be repaired (else only report).
    pub repair: bool,
    /// When the newest commit record is damaged, go back to the newest readable delta,
    /// losing the deltas after it (`dxfs fsck --rollback`, as `-o recovery=rollback`).
    /// Without it such a volume is reported and left alone.
    pub rollback: bool,
}

/// [`check`], with options.
pub fn check_with(dev: Arc<dyn BlockDevice>, opts: &CheckOptions, progress: &mut dyn FnMut(u64)) -> Result<Report> {
    let repair = opts.repair;
    let rolled = if opts.rollback && repair { roll_back(&dev)? } else { None };
    let mut r = check_marked(dev, repair, progress).map_err(|e| match e {
        // A repair's delta (a rebuilt index, lost+found) found no free block.
        Error::NoSpace if repair => Error::Invalid(
            "a repair needs free blocks and the volume has none left: free or add space, then run fsck again".into(),
        ),
        e => e,
    })?;
    r.fixed.splice(0..0, rolled);
    Ok(r)
}

/// A volume whose newest commit record is damaged: open it allowing the rollback, and
/// commit at once, so the state block names the delta it went back to. Returns what
/// was done, or `None` when nothing needed it.
fn roll_back(dev: &Arc<dyn BlockDevice>) -> Result<Option<String>> {
    let sb = read_usable_superblock(&**dev)?;
    let home = {
        let mut b = [0u8; BLOCK_SIZE];
        dev.read(STATE_BLOCK, &mut b)?;
        verify(&b, STATE_BLOCK, Some(STATE_MAGIC)).ok().map(|_| State::decode(&b).commit_seq)
    };
    use crate::engine::log::Journal;
    let (journal, _) = Journal::recover_from(&**dev, sb.layout, false, true)?;
    // Either the state block names a later delta than the newest usable commit, or the
    // newest commit record cannot be used at all (it may be a checkpoint's, which the
    // state block does not name).
    let unusable = Journal::recover_from(&**dev, sb.layout, false, false).is_err();
    let lost = home.filter(|&h| h > journal.seq);
    if lost.is_none() && !unusable {
        return Ok(None);
    }
    let vol = Volume::open_for_repair(dev.clone(), true)?;
    vol.repair(|_, _| Ok(()))?;
    vol.close()?;
    Ok(Some(match lost {
        Some(home) => format!(
            "the commit record of delta {home} was damaged: rolled back to delta {}, the newest readable one \
             (what deltas {}..={home} changed is lost)",
            journal.seq,
            journal.seq + 1
        ),
        None => format!(
            "the newest commit record was damaged: rolled back to delta {}, the newest readable one \
             (the damaged record named no change that the state block shows committed)",
            journal.seq
        ),
    }))
}

fn check_marked(dev: Arc<dyn BlockDevice>, repair: bool, progress: &mut dyn FnMut(u64)) -> Result<Report> {
    let sb = read_usable_superblock(&*dev)?;
    let repair_ok = repair && sb.ro_compat & !KNOWN_RO_COMPAT == 0;
    let (mut warnings, mut errors, mut fixed) = (Vec::new(), Vec::new(), Vec::new());
    match mark::inspect(&*dev, &sb)? {
        Some(Ok(m)) if m.in_use && !repair_ok => {
            if mark::looks_held(&m) {
                warnings.push(format!(
                    "the volume is in use by {}: checking what is on disk, which may lag behind",
                    mark::describe(&m)
                ));
            } else {
                warnings.push(format!(
                    "the volume was not closed cleanly by {} (a read-write open takes it over once it is sure the mark is stale)",
                    mark::describe(&m)
                ));
            }
        }
        Some(Err(e)) if repair_ok => fixed.push(format!("mount mark unreadable ({e}): written again")),
        Some(Err(e)) => errors.push(format!("mount mark unreadable ({e}); a repair writes it again")),
        _ => {}
    }
    let _held = if repair_ok { mark::acquire(&dev, &sb, mark::DEFAULT_INTERVAL_MS, None)? } else { None };
    let mut r = check_pass(dev.clone(), repair, progress, 0)?;
    // The recursive counters follow every other repair, and the passes may have run out
    // before they were rebuilt: one more check, which rebuilds them silently (pass > 0).
    if repair && sb.rstats() && !r.fixed.is_empty() && r.errors.is_empty() {
        let last = check_pass(dev, repair, progress, 1)?;
        r.fixed.extend(last.fixed);
        r.errors.extend(last.errors);
    }
    r.warnings.splice(0..0, warnings);
    r.errors.splice(0..0, errors);
    r.fixed.splice(0..0, fixed);
    Ok(r)
}

fn check_pass(dev: Arc<dyn BlockDevice>, repair: bool, progress: &mut dyn FnMut(u64), pass: u32) -> Result<Report> {
    let sb = read_usable_superblock(&*dev)?;
    // A volume with features this fsck does not know may be checked but not changed.
    let repair = repair && sb.ro_compat & !KNOWN_RO_COMPAT == 0;
    if repair && pass < MAX_DROP_PASSES {
        if let Some(found) = repair::find_root(&*dev, &sb)? {
            let fixed = Superblock { root_ino: found, ..sb.clone() };
            for at in [SUPERBLOCK, sb.layout.backup_superblock()] {
                dev.write(at, &fixed.encode(at)[..])?;
            }
            dev.flush()?;
            let mut next = check_pass(dev, repair, progress, pass + 1)?;
            next.fixed.insert(
                0,
                format!(
                    "both superblock copies named inode {} as the root, which is none: \
                     the root is directory {found}, its own parent (written to both)",
                    sb.root_ino
                ),
            );
            return Ok(next);
        }
    }
    let mut r = Report { blocks_total: sb.layout.block_count, ..Default::default() };
    let (sb_fixes, sb_held) = superblock_copies(&*dev, &sb)?;
    // A damaged free-space map or state block does not stop the check: both follow from
    // the tree, and are rebuilt from what the walk finds.
    let (st, state, bitmap_damage, state_damage, mut journal, miscounted, held) =
        match crate::engine::store::open_lenient(dev.clone(), sb.clone(), repair, 1 << 16, true, false) {
            Ok(o) => {
                let (b, s) = (o.bitmap_damage.map(|e| e.to_string()), o.state_damage.map(|e| e.to_string()));
                r.rebuilt.extend(b.iter().chain(&s).cloned());
                (o.opened.store, o.opened.state, b, s, o.opened.journal, o.opened.miscounted, o.held_data)
            }
            Err(crate::error::Error::Corrupt(m)) => {
                // A damaged newest commit: the way out loses that delta, so it is asked for.
                let hint = if m.contains("commit") {
                    " (dxfs fsck --rollback goes back to the newest readable delta, losing the ones after it)"
                } else {
                    ""
                };
                r.errors.push(format!("cannot open the volume: {m}{hint}"));
                return Ok(r);
            }
            Err(e) => return Err(e),
        };
    let root = sb.root_ino;
    let w_sb = sb.clone();
    let mut w = Walk::new(st, r, progress);
    // A grown volume's bitmap blocks beyond the contiguous ones, and the mount mark, lie
    // in the data area.
    for b in w_sb.layout.spilled_bitmap_blocks() {
        w.own(b, 0, "free-space bitmap");
    }
    if w_sb.layout.mark_block != 0 {
        w.own(w_sb.layout.mark_block, 0, "mount mark");
    }
    let Tree { mut inodes, subdirs, drops, root_lost } = w.namespace(root)?;
    let orphans = w.orphans(state.orphan_head, &mut inodes)?;
    let rstat_found = w.rstat_records();
    let xattr_counts = w.xattr_counts();
    w.regions(&inodes);
    let nlink_fixes = w.nlink_fixes(&inodes, &orphans, &subdirs);
    let Slots { lazy, lazy_all, mut lazy_drops, mut slot_fixes, reinit } = w.inode_slots(&inodes);
    // Logged file data the open held back, its home holding a metadata block: replayed
    // where a file owns the block (stale metadata that a crash left before the data
    // arrived), dropped where metadata or nothing does (a damaged log). A drop then
    // commits an empty delta, so that no later open replays that log again.
    let (mut replayed, mut dropped_log) = (false, false);
    for (t, img) in held {
        let seq = journal.seq;
        if w.file_data(t) {
            let m = format!("delta {seq} logs file data for block {t}, which still holds stale metadata");
            if repair {
                dev.write(t, &img[..])?;
                replayed = true;
                w.r.fixed.push(format!("{m}: replayed"));
            } else {
                w.r.errors.push(format!("{m} (a repair replays the data)"));
            }
        } else {
            let what = if w.meta.contains(&t) { "live metadata" } else { "a metadata block that no file owns" };
            let m = format!("delta {seq} logs file data for block {t}, which holds {what}");
            if repair {
                dropped_log = true;
                w.r.fixed.push(format!("{m}: not replayed"));
            } else {
                w.r.errors.push(format!("{m} (a repair drops it)"));
            }
        }
    }
    if replayed {
        dev.flush()?;
    }
    if dropped_log {
        journal.commit(&*dev, &[], &[])?;
    }
    let over_meta = w.data_over_metadata();
    let cloned = w.shared_data();
    let layout = w.st.sb.layout;
    let Usage { mut leaked, marked_free } = w.space_map(bitmap_damage.is_some());
    // Live inodes that no directory names (their entry went with a directory leaf, or was
    // dropped): a repair puts the sound ones into /lost+found. What they own is theirs,
    // not leaked, and their slots are live.
    // (A known inode block holding such an inode is one whose slot mask is off.)
    let mismatched: Vec<u64> = slot_fixes.iter().map(|f| f.0).collect();
    let (lost, claimed, lost_all, lost_heads) = w.find_lost(&mismatched, &lazy_all, &leaked);
    // A lazy-free record of a block lost inodes live in stays: it frees other slots.
    lazy_drops.retain(|b| !claimed.contains(b));
    let xattr_fixes: Vec<(u64, u32, u32)> = xattr_counts
        .iter()
        .map(|&(b, c, n)| (b, c, n + lost_heads.get(&b).copied().unwrap_or(0)))
        .filter(|&(_, c, n)| c != n)
        .collect();
    if !lost.is_empty() {
        leaked.retain(|b| !claimed.contains(b));
        for &b in &claimed {
            w.owner.entry(b).or_insert(u64::MAX);
        }
        let mut lost_slots: HashMap<u64, u16> = HashMap::new();
        for &ino in &lost_all {
            let (b, s) = ino_loc(ino);
            *lost_slots.entry(b).or_insert(0) |= 1 << s;
        }
        slot_fixes.retain_mut(|(b, used, want)| {
            *want |= lost_slots.get(b).copied().unwrap_or(0);
            let freed = lazy.get(b).copied().unwrap_or(0);
            freed & !*used != 0 || *used & !freed != *want
        });
    }
    // A wrong inode count is repaired with the rest (dropped entries leave one).
    let live = w.r.inodes + lost_all.len() as u64;
    let inode_count_fix = (state.inodes != live && state_damage.is_none()).then_some((state.inodes, live));
    let rstats = rstat_found.map(|(found, broken, unowned)| w.check_rstats(&inodes, &found, broken, unowned));
    let mut r = w.r;
    // Repairs in two kinds. Global ones follow from the whole walk (a leak is a block
    // nothing seen owns; a link count counts the entries seen), so they are made only when
    // the walk saw everything: no error at all, or only errors that hid nothing (a bad
    // name, a size out of range). Local ones follow from one inode or block and are made
    // whatever else is wrong.
    let global_ok = r.errors.is_empty() || w.complete;
    let mut global: Vec<String> = leaked
        .iter()
        .take(20)
        .map(|b| format!("block {b} is marked in use but owned by nothing"))
        .chain(nlink_fixes.iter().map(|(i, have, want)| format!("inode {i}: link count {have}, should be {want}")))
        .chain(
            slot_fixes
                .iter()
                .map(|(b, have, want)| format!("inode block {b}: used slots {have:#06x}, should be {want:#06x}")),
        )
        .chain(
            lazy_drops
                .iter()
                .map(|b| format!("lazy-free record of block {b} is malformed or for a block with no live inode")),
        )
        .chain(inode_count_fix.map(|(have, want)| format!("state block counts {have} inodes, found {want}")))
        .chain(xattr_fixes.iter().map(|(b, c, n)| format!("xattr block {b}: reference count {c}, used by {n} inodes")))
        .chain(
            reinit.iter().map(|(b, _)| format!("inode block {b} is unreadable and holds no live inode: written empty")),
        )
        // A count is rewritten from the bits only once the walk has put right every bit
        // it could (a bit under an unwalked block must keep the map untrusted).
        .chain(miscounted.iter().map(|(_, m)| format!("free-space map: {m}")))
        .collect();
    let recount: Vec<u64> = miscounted.iter().map(|&(i, _)| i).collect();
    if leaked.len() > 20 {
        // A repairable finding like the rest: it must not block the repair itself.
        global.insert(20, format!("... and {} more leaked blocks", leaked.len() - 20));
    }
    // Inode fields of an inode that is itself unusable are not worth setting.
    let inode_fixes: Vec<(u64, InodeFix, String)> =
        w.inode_fixes.iter().filter(|(ino, ..)| !w.bad.contains(ino)).cloned().collect();
    let rekey: Vec<_> =
        w.rekey.iter().filter(|(d, ..)| !w.bad.contains(d) && !w.salvage.contains(d)).cloned().collect();
    let local: Vec<String> = marked_free
        .iter()
        .take(20)
        .map(|b| format!("block {b} is in use but marked free"))
        .chain(
            (marked_free.len() > 20)
                .then(|| format!("... and {} more blocks in use but marked free", marked_free.len() - 20)),
        )
        .chain(inode_fixes.iter().map(|(_, _, m)| m.clone()))
        .chain(rekey.iter().map(|(d, k, name, ..)| {
            format!("directory {d}: entry {:?} moved from key {k:#x} to its name's", String::from_utf8_lossy(name))
        }))
        // Local: the list is cut at an inode seen to be named, linked or unreadable, and
        // cutting it early frees nothing; an incomplete walk must not leave it for the
        // next read-write open to free a named inode (fuzzer seed 2684506863).
        .chain(w.orphan_cut.map(|after| match after {
            None => "orphan list emptied".to_string(),
            Some(i) => format!("orphan list ended after inode {i}"),
        }))
        .collect();
    // The counters follow from everything else: with other findings they are checked
    // again once those are repaired, and not reported (they would follow the damage).
    // Alone they are rebuilt, and reported unless this pass checks what a repair left
    // (the counters then followed the other repairs).
    let rstats = rstats.filter(|c| !c.errors.is_empty());
    let others = !global.is_empty() || !local.is_empty() || !lost.is_empty() || !r.errors.is_empty();
    let rstats_later = rstats.is_some() && others;
    let rstat_fix = rstats.is_some() && !rstats_later;
    if let Some(c) = rstats.as_ref().filter(|_| rstat_fix && pass == 0) {
        global.extend(c.errors.iter().map(|m| format!("{m} (the counters are rebuilt)")));
    }
    let lost_msgs: Vec<String> = lost
        .iter()
        .map(|l| format!("inode {} ({}) is in no directory: a repair puts it into /lost+found", l.ino, l.what()))
        .collect();
    // The superblock copies: rewritten from the one in use, whatever else is wrong.
    if repair {
        for (at, msg) in sb_fixes {
            dev.write(at, &w_sb.encode(at)[..])?;
            dev.flush()?;
            r.fixed.push(msg);
        }
    } else {
        r.errors.extend(sb_fixes.into_iter().map(|(_, m)| m));
    }
    r.errors.extend(sb_held);
    if !r.rebuilt.is_empty() {
        // Written in place, outside any delta: a crash half way leaves them damaged again,
        // and the next fsck rebuilds them again. The free-space map needs the whole walk
        // (a block the walk did not see would be freed). The state block does not: what
        // an incomplete walk gets wrong (the inode count, orphans) the next pass repairs,
        // and the repairs of this pass need a readable state block to open the volume.
        let state_now = repair && state_damage.is_some();
        let bitmap_now = repair && bitmap_damage.is_some() && global_ok;
        if state_now || bitmap_now {
            let next_generation = inodes.values().map(|i| i.generation).max().unwrap_or(0).wrapping_add(1);
            let state = State {
                orphan_head: 0,
                next_generation,
                commit_seq: journal.seq,
                inodes: r.inodes,
                lazy_frees: TreeRoot::default(),
                rstats: TreeRoot::default(),
            };
            rebuild(&*dev, layout, bitmap_now.then_some(&w.owner), state_now.then_some(state))?;
        }
        for (d, now) in [(&bitmap_damage, bitmap_now), (&state_damage, state_now)] {
            match d {
                Some(d) if now => r.fixed.push(format!("{d}: rebuilt from the tree")),
                Some(d) => r.errors.push(format!("{d} (a repair rebuilds it from the tree)")),
                None => {}
            }
        }
    }
    // Errors that block the repairs above, but some of them only because an entry names
    // an inode that cannot be used: drop those entries (their inodes' blocks and slots
    // are then leaked, and the next pass reclaims them) and check again.
    // Entries in a directory about to be rebuilt wait for the next pass.
    let drops: Vec<Drop> = drops.into_iter().filter(|(d, ..)| !w.bad.contains(d) && !w.salvage.contains(d)).collect();
    let salvage: Vec<u64> = w.salvage.iter().copied().collect();
    if repair && root_lost && pass < MAX_DROP_PASSES {
        // Nothing else can be checked without the root: recreate it first.
        drop(w.st);
        // What this pass already wrote (the superblock copies, a rebuilt map) is told too.
        let mut told = std::mem::take(&mut r.fixed);
        told.push(recreate_root(dev.clone())?);
        let mut next = check_pass(dev, repair, progress, pass + 1)?;
        next.fixed.splice(0..0, told);
        return Ok(next);
    }
    if repair && !r.errors.is_empty() && (!drops.is_empty() || !salvage.is_empty()) && pass < MAX_DROP_PASSES {
        drop(w.st);
        let mut told = std::mem::take(&mut r.fixed);
        told.extend(drops.iter().map(|(d, key, name, c)| {
            let invalid = crate::fs::dir::check_name(name).is_err();
            let name = String::from_utf8_lossy(name);
            if invalid {
                format!("directory {d}: dropped entry {name:?}, which is not a valid name (inode {c} is kept)")
            } else if w.second_names.contains(&(*d, *key)) {
                format!("directory {d}: dropped a second entry {name:?} (inode {c} is kept)")
            } else {
                format!("directory {d}: dropped entry {name:?}, which names unusable inode {c} (its contents are lost)")
            }
        }));
        told.extend(drop_entries(dev.clone(), &drops, &salvage, &marked_free)?);
        let mut next = check_pass(dev, repair, progress, pass + 1)?;
        next.fixed.splice(0..0, told);
        return Ok(next);
    }
    let do_global = repair && global_ok && (!global.is_empty() || !lost.is_empty() || rstat_fix);
    let do_local = repair && !local.is_empty();
    if do_global || do_local {
        drop(w.st);
        let none: &[u64] = &[];
        let fixes = Fixes {
            leaked: if do_global { &leaked } else { none },
            nlinks: if do_global { &nlink_fixes } else { &[] },
            slots: if do_global { &slot_fixes } else { &[] },
            lazy_drops: if do_global { &lazy_drops } else { none },
            reinit: if do_global { &reinit } else { &[] },
            marked_free: &marked_free,
            recount: if do_global { &recount } else { none },
            xattr_refs: if do_global { &xattr_fixes } else { &[] },
            inode_fixes: &inode_fixes,
            inode_count: inode_count_fix.filter(|_| do_global).map(|f| f.1),
            rekey: &rekey,
            orphan_cut: w.orphan_cut,
            rstats: rstats.as_ref().filter(|_| do_global && rstat_fix),
            drop_rstats: rstats.as_ref().is_some_and(|c| c.unowned),
        };
        repair_volume(dev.clone(), &fixes)?;
        r.fixed.extend(local);
        // The blocks a dropped extent covered were owned twice, which held back the
        // global repairs, and an xattr list stored again leaves the old chain's blocks
        // that were not plainly its own (a damaged chain may name another's block) to be
        // found leaked: check again, so that one fsck leaves the volume clean.
        let again = over_meta > 0
            || cloned > 0
            // A moved entry was also an error, which held back the global repairs.
            || !rekey.is_empty()
            || inode_fixes.iter().any(|(_, f, _)| matches!(f, InodeFix::Xattrs(_)))
            // (Lost inodes are put back below, and that checks again too.)
            || (rstats_later && lost.is_empty());
        if again && pass < MAX_DROP_PASSES {
            let mut told = std::mem::take(&mut r.fixed);
            if do_global {
                told.extend(global);
            }
            let mut next = check_pass(dev, repair, progress, pass + 1)?;
            next.fixed.splice(0..0, told);
            return Ok(next);
        }
        if do_global {
            r.fixed.extend(global);
        } else {
            r.errors.extend(global);
        }
        if do_global && !lost.is_empty() && pass < MAX_DROP_PASSES {
            // Back into the namespace, then checked again like any other inode (their
            // link counts, a directory's parent).
            let mut told = std::mem::take(&mut r.fixed);
            told.extend(reattach(dev.clone(), &lost)?);
            let mut next = check_pass(dev, repair, progress, pass + 1)?;
            next.fixed.splice(0..0, told);
            return Ok(next);
        }
        r.errors.extend(lost_msgs);
    } else {
        r.errors.extend(local);
        r.errors.extend(global);
        r.errors.extend(lost_msgs);
    }
    Ok(r)
}

/// A superblock copy a repair writes again: its block, and what is wrong with it.
type SuperblockFix = (u64, String);

/// Both superblock copies must be intact and agree with `sb`, the one in use: the copies
/// a repair rewrites, each with what is wrong, and what it must leave (a backup's place
/// holding another structure).
fn superblock_copies(dev: &dyn BlockDevice, sb: &Superblock) -> Result<(Vec<SuperblockFix>, Vec<String>)> {
    let (mut fixes, mut held) = (Vec::new(), Vec::new());
    for at in [SUPERBLOCK, sb.layout.backup_superblock()] {
        let mut b = [0u8; BLOCK_SIZE];
        dev.read(at, &mut b)?;
        match Superblock::decode(&b, at) {
            Ok(copy) if copy == *sb => {}
            // A grow being finished clears GROW_PENDING in the backup first; the next
            // read-write open finishes it again and rewrites both (volume/resize.rs).
            Ok(copy)
                if at != SUPERBLOCK
                    && sb.grow_from != 0
                    && copy
                        == Superblock {
                            ro_compat: sb.ro_compat & !RO_COMPAT_GROW_PENDING,
                            grow_from: 0,
                            ..sb.clone()
                        } => {}
            Ok(_) => fixes.push((at, format!("superblock copy in block {at} differs from the one in use"))),
            // Sealed for its place as another kind of block: maybe live (the count that
            // puts the backup there may be the damage), so never written over.
            Err(_) if at != SUPERBLOCK && get_u32(&b, 0) != SB_MAGIC && verify(&b, at, None).is_ok() => {
                held.push(format!(
                    "superblock copy in block {at} is missing: the block holds another structure (magic {:#010x}), \
                 which a repair does not write over (is the volume's block count, {}, right?)",
                    get_u32(&b, 0),
                    sb.layout.block_count
                ))
            }
            Err(e) => fixes.push((at, format!("superblock copy in block {at} is damaged: {e}"))),
        }
    }
    Ok((fixes, held))
}
