//! Storage GC: regular files rewritten without the versions no snapshot can
//! see any more.
//!
//! ```text
//!  gts = LWM ─▶ F's rows not deleted at gts ─▶ new file F' (new id, same order, same create_ts)
//!            ─▶ under F's shard: index + MI moved to F', F's deletes since gts carried over
//!               ("dual delete": F's visibility is read whole while no delete can reach it),
//!               F replaced by F' in its part, F retired by snapshot
//! ```
//!
//! * **Nothing changes an answer.** F' holds every row of F not deleted at
//!   `gts ≤ LWM`; the deletes after that come over with their timestamps (the
//!   folded ones at the newest base, which no live snapshot is below). A
//!   snapshot at any `qts ≥ LWM` reads the same rows from F' as from F; one
//!   that took its view of the part before the swap keeps reading F, which is
//!   deleted only once no reader registered before the swap is left and a
//!   committed checkpoint no longer names it (as after `combine`).
//! * **A failure leaves no change.** F' is written before anything else
//!   moves; every check (each index version points at a row F' has, each
//!   carried delete lands in F') runs before the first change under the shard
//!   lock, and the changes after that cannot fail. A crash (or a failed
//!   check) before the swap leaves F' unnamed: the next recovery's vacuum
//!   deletes it.
//! * **Visibility checkpoints hold it off.** A long query moved to a
//!   visibility checkpoint ([`crate::frozen`]) reads bitmaps keyed by the
//!   file ids of its time, below LWM: while one is retained (its
//!   [`StorageGcPause`] alive) no file is swapped.
//! * Row ids of the moved rows are new (one range above every other), so the
//!   main index gets one entry for F' instead of F's per-block ones.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::buffer::{FileKind, LakeFile, TablePart};
use crate::engine::{Engine, Retired};
use crate::error::{Error, Result};
use crate::ids::{FileId, RowId, Ts};
use crate::index::RangeEntry;
use crate::lake::{RegularFile, file_path};
use crate::mvcc::lock;
use crate::rewrite::{RewriteClaim, RewriteJob, RewriteRequest, encode_rows};
use crate::visibility::{FileVisibility, RewriteDeletes};

/// What one storage-GC round did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StorageGcReport {
    /// The snapshot the rewrites kept rows of (LWM when the round began).
    pub gts: Ts,
    /// Files rewritten.
    pub files_rewritten: usize,
    /// Rows left out of the rewrites (deleted at `gts`).
    pub rows_dropped: usize,
    /// Rows the rewritten files kept.
    pub rows_kept: usize,
    /// Bytes of the files rewritten, where known.
    pub bytes_before: u64,
    /// Bytes of the files written.
    pub bytes_after: u64,
    /// Rewrites abandoned at the swap: a visibility checkpoint paused GC.
    pub abandoned: usize,
    /// Rewrites that failed (the rewrite worker's error is logged; the
    /// file is left as it was and the next round tries again).
    pub failed: usize,
}

/// A file storage GC rewrites this round.
struct Candidate<'a> {
    part: Arc<TablePart>,
    file: FileId,
    regular: Arc<RegularFile>,
    /// Its rows deleted at the round's gts.
    dropped: Vec<u32>,
    /// Held until the swap is done: no other round rewrites the file.
    _claim: RewriteClaim<'a>,
}

/// Holds storage GC off while alive: no swap happens once it is taken (a
/// rewrite under way is abandoned at its swap). Taken before a visibility
/// checkpoint is captured, kept as long as the checkpoint is read.
#[derive(Debug)]
pub struct StorageGcPause(Arc<AtomicUsize>);

impl Drop for StorageGcPause {
    fn drop(&mut self) {
        // Relaxed: the count is only read under a part lock (see `paused`).
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Engine {
    /// Holds storage GC off until the pause is dropped. A capture of the
    /// parts after this call and any swap are ordered by the part locks:
    /// a swap checks the pause under the part's lock, after which a capture
    /// sees the swapped file, or before it, when the pause is seen.
    pub fn pause_storage_gc(&self) -> StorageGcPause {
        // Relaxed: published to a swap through the part lock the capture
        // takes after this (the swap reads it under the same lock).
        self.storage_gc_pauses.fetch_add(1, Ordering::Relaxed);
        StorageGcPause(Arc::clone(&self.storage_gc_pauses))
    }

    /// Rewrites every regular file whose rows deleted at LWM are at least
    /// `threshold` of its rows (and at least one) without them. Changes no
    /// answer of any query. A file that fails is left as it was; the error
    /// names it.
    pub fn storage_gc(&self, threshold: f64) -> Result<StorageGcReport> {
        let gts = self.clock.lwm();
        let mut report = StorageGcReport { gts, ..StorageGcReport::default() };
        let mut candidates = Vec::new();
        for part in self.all_parts() {
            let files: Vec<_> = lock(&part.state)
                .files
                .iter()
                .filter_map(|f| match &f.kind {
                    FileKind::Regular(r) => Some((f.id, Arc::clone(r), Arc::clone(&f.vis))),
                    FileKind::Virtual { .. } => None,
                })
                .collect();
            for (id, regular, vis) in files {
                let rows = regular.rows();
                let dropped = vis.deleted_rows(gts)?;
                if rows == 0 || dropped.is_empty() || (dropped.len() as f64) < threshold * rows as f64 {
                    continue;
                }
                // Claimed under the part's lock, if the file is still the
                // one read (another round may have swapped it meanwhile).
                let claim = {
                    let state = lock(&part.state);
                    let same = state
                        .files
                        .iter()
                        .any(|f| f.id == id && matches!(&f.kind, FileKind::Regular(r) if Arc::ptr_eq(r, &regular)));
                    if same { self.rewriting.claim(part.table.id, id) } else { None }
                };
                let Some(_claim) = claim else { continue };
                candidates.push(Candidate { part: Arc::clone(&part), file: id, regular, dropped, _claim });
            }
        }
        if candidates.is_empty() || self.storage_gc_paused() {
            return Ok(report);
        }
        // The rewrites, outside every lock (on the rewrite worker: here or
        // in GC functions), then the swaps one by one.
        let mut requests = Vec::new();
        let mut outputs = Vec::with_capacity(candidates.len());
        for c in &candidates {
            let rows = c.regular.rows();
            if c.dropped.len() == rows {
                outputs.push(None); // nothing to write: the file goes
                continue;
            }
            // Relaxed: ids only need to be unique (fenced by epoch).
            let new_id = FileId(self.file_ids.fetch_add(1, Ordering::Relaxed));
            let output = file_path(c.part.table.id, new_id);
            requests.push(RewriteRequest {
                lake: None,
                job: RewriteJob::DropRows {
                    source: c.regular.path.to_string(),
                    rows,
                    dropped: encode_rows(&c.dropped, rows)?,
                },
                output: output.to_string(),
                row_group_rows: self.config.block_rows,
            });
            outputs.push(Some((new_id, output)));
        }
        let mut answers = self.run_rewrites(&requests).into_iter();
        for (c, output) in candidates.iter().zip(outputs) {
            let written = match output {
                None => None,
                Some((new_id, path)) => match answers.next() {
                    Some(Ok(answer)) if answer.rows == c.regular.rows() - c.dropped.len() => {
                        Some((new_id, answer.file(path)))
                    }
                    outcome => {
                        let why = match outcome {
                            Some(Ok(a)) => {
                                format!("the rewrite wrote {} rows, not {}", a.rows, c.regular.rows() - c.dropped.len())
                            }
                            Some(Err(f)) => f.to_string(),
                            None => "no outcome".into(),
                        };
                        tracing::warn!(table = %c.part.table.name, file = %c.file, "storage GC left the file as it was (the next round retries): {why}");
                        report.failed += 1;
                        self.discard_output(&path);
                        continue;
                    }
                },
            };
            let output = written.as_ref().map(|(_, f)| f.path.clone());
            if let Err(e) = self.swap(c, written, gts, &mut report) {
                if let Some(path) = output {
                    self.discard_output(&path);
                }
                return Err(Error::invariant(format!(
                    "storage GC of {} of table {} (left as it was): {e}",
                    c.file, c.part.table.name
                )));
            }
        }
        Ok(report)
    }

    /// Deletes the output of a rewrite that is not swapped in (nothing
    /// names it; a failure leaves it to the next recovery's vacuum).
    pub(crate) fn discard_output(&self, path: &object_store::path::Path) {
        if let Err(e) = self.lake.delete(path) {
            tracing::warn!("the unused rewrite {path} stays until the next recovery's vacuum: {e}");
        }
    }

    /// Swaps candidate `c`'s file for `written` (its rows not deleted at
    /// `gts`; `None`: none are left).
    fn swap(
        &self,
        c: &Candidate,
        written: Option<(FileId, RegularFile)>,
        gts: Ts,
        report: &mut StorageGcReport,
    ) -> Result<()> {
        let Candidate { part, file, regular, dropped, .. } = c;
        let file = *file;
        let rows = regular.rows();
        // new_offset[old offset] (u32::MAX: dropped).
        let mut new_offset = vec![0u32; rows];
        for &d in dropped {
            *new_offset.get_mut(d as usize).ok_or_else(|| {
                Error::invariant(format!("deleted row {d} beyond the {rows} rows of {}", regular.path))
            })? = u32::MAX;
        }
        let mut kept = 0u32;
        for n in new_offset.iter_mut().filter(|n| **n != u32::MAX) {
            *n = kept;
            kept += 1;
        }
        // The offset in the new file of an old one (`None`: dropped).
        let new_of = |old: usize| new_offset.get(old).copied().filter(|&n| n != u32::MAX);
        let new_id = written.as_ref().map_or(FileId(0), |(id, _)| *id);
        let written = written.map(|(_, f)| f);

        // A checkpoint being written reads rows this moves: wait for it
        // (and keep the next from being captured until the swap is whole).
        let _no_image = self.no_image_in_progress();
        let mut shard = lock(&self.shards[part.shard.0 as usize]);
        let mut state = lock(&part.state);
        if self.storage_gc_paused() {
            drop((state, shard));
            report.abandoned += 1;
            if let Some(w) = written {
                self.discard_output(&w.path);
            }
            return Ok(());
        }
        // Versions no snapshot ≥ LWM sees would point at dropped rows.
        shard.purge(self.clock.lwm());
        let ranges: Vec<RangeEntry> = shard.main.ranges().iter().filter(|r| r.file == file).copied().collect();
        let slot = match ranges.first() {
            Some(r) if ranges.iter().all(|x| x.file_slot == r.file_slot) => r.file_slot as usize,
            Some(_) => return Err(Error::invariant(format!("{file} has ranges in two visibility slots"))),
            None => return Err(Error::invariant(format!("{file} has no row-id range in its shard"))),
        };
        let old_vis = Arc::clone(
            shard
                .writers
                .get(slot)
                .filter(|w| w.visibility().file() == file)
                .ok_or_else(|| Error::invariant(format!("slot {slot} is not the visibility writer of {file}")))?
                .visibility(),
        );
        crate::replay::check_row_ids(shard.id(), shard.next_row_id, u64::from(kept))?;
        let start = shard.next_row_id;
        // The new row id of an old one in `file` (`Some(None)`: a dropped row).
        let moved = |row: RowId| -> Option<Option<RowId>> {
            let i = ranges.partition_point(|r| r.start <= row.0).checked_sub(1)?;
            let r = &ranges[i];
            let delta = row.0 - r.start;
            (delta < u64::from(r.len))
                .then(|| new_of(r.offset as usize + delta as usize).map(|n| RowId(start + u64::from(n))))
        };
        if let Some(row) = shard.index.rows().find(|&r| matches!(moved(r), Some(None))) {
            return Err(Error::invariant(format!(
                "index version at {row:?} points at a row deleted at {gts:?}, below LWM"
            )));
        }
        // Dual delete: the deletes of `file` since `gts`, onto the new file.
        let RewriteDeletes { base, deleted, later } = old_vis.deletes_for_rewrite(gts)?;
        let carried: Vec<u32> = deleted.iter().filter_map(|&d| new_of(d as usize)).collect();
        let (vis, mut writer) = FileVisibility::restore(new_id, kept as usize, &carried, base)?;
        for (d, ts) in later {
            let n = new_of(d as usize).ok_or_else(|| {
                Error::invariant(format!("row {d} of {file} deleted at {ts:?} was already deleted at {gts:?}"))
            })?;
            writer.delete(n as usize, ts)?;
        }
        let range =
            (kept > 0).then_some(RangeEntry { start, len: kept, file: new_id, file_slot: slot as u32, offset: 0 });
        shard.main.replace_file(file, range)?;
        // Nothing below fails: the swap is whole.
        shard.index.remap_rows(|r| moved(r).flatten());
        shard.next_row_id += u64::from(kept);
        shard.writers[slot] = writer;
        report.bytes_after += written.as_ref().and_then(|w| w.footer_range.as_ref()).map_or(0, |r| r.end);
        {
            let at = state.files.iter().position(|f| f.id == file);
            match (at, written) {
                (Some(i), Some(regular)) => {
                    state.files[i] = LakeFile { id: new_id, vis, kind: FileKind::Regular(Arc::new(regular)) };
                }
                (Some(i), None) => {
                    state.files.remove(i);
                }
                (None, _) => unreachable!("only storage GC removes regular files, and it holds the shard"),
            }
            // Readers registered before this point may still read `file`;
            // pushed under the part's lock as combine does (a checkpoint that
            // began before the push reads the part after the swap).
            let mut retired = lock(&self.retired);
            let begun_before = retired.checkpoints_begun;
            retired.entries.push(Retired::new(self.clock.registration_seq(), vec![regular.path.clone()], begun_before));
        }
        drop((state, shard, _no_image));
        report.files_rewritten += 1;
        report.rows_dropped += rows - kept as usize;
        report.rows_kept += kept as usize;
        report.bytes_before += regular.footer_range.as_ref().map_or(0, |r| r.end);
        Ok(())
    }

    /// True while a [`StorageGcPause`] is alive.
    fn storage_gc_paused(&self) -> bool {
        // Relaxed: see `pause_storage_gc`.
        self.storage_gc_pauses.load(Ordering::Relaxed) > 0
    }
}
