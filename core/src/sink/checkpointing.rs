//! Checkpoints from the sink: capturing one at a transaction boundary,
//! writing and committing it on a thread of its own, pruning the catalog's
//! history after it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::catalog::{Catalog, CatalogCommit, CheckpointRecord};
use crate::cdc::SourcePosition;
use crate::checkpoint::PendingCheckpoint;
use crate::error::{Error, Result};

use super::*;

/// A checkpoint captured by [`Sink::start_checkpoint`], being written.
pub(super) struct CheckpointInFlight {
    /// Writes and commits it.
    pub(super) thread: std::thread::JoinHandle<CheckpointOutcome>,
    pub(super) resume: SourcePosition,
    pub(super) began: Instant,
    /// How long the capture held the sink.
    pub(super) captured: Duration,
}

/// What the writer thread of a checkpoint does: write its objects, commit
/// it to the catalog with the history and operations it owes, tell the
/// engine, publish the watermarks, delete what older checkpoints left.
/// Nothing of it holds the sink.
pub(super) struct CheckpointJob {
    pub(super) pending: PendingCheckpoint,
    pub(super) catalog: Arc<dyn Catalog>,
    pub(super) commit: CatalogCommit,
    pub(super) input: String,
    pub(super) resume: SourcePosition,
    pub(super) source_state: Option<String>,
    /// Prune the catalog once the checkpoint is committed.
    pub(super) prune: Option<crate::catalog::Retention>,
    /// Publishes the checkpoint once it is committed.
    pub(super) publisher: Option<Arc<dyn super::CheckpointPublisher>>,
}

/// What became of a [`CheckpointJob`].
pub(super) struct CheckpointOutcome {
    pub(super) result: Result<crate::checkpoint::Manifest>,
    /// On failure, the history and operations to give back.
    pub(super) commit: CatalogCommit,
    pub(super) written: Duration,
    pub(super) committed: Duration,
    pub(super) cleanup_failures: u64,
    /// Publishing the checkpoint failed (the next one publishes again).
    pub(super) publish_failures: u64,
    /// Publishing the watermarks failed after the commit (a fenced
    /// replayer's store refuses it): the sink stops with it.
    pub(super) late: Option<Error>,
}

impl CheckpointJob {
    pub(super) fn run(mut self) -> CheckpointOutcome {
        let began = Instant::now();
        let failed = |e: Error, mut commit: CatalogCommit| {
            commit.checkpoint = None;
            CheckpointOutcome {
                result: Err(e),
                commit,
                written: Duration::ZERO,
                committed: Duration::ZERO,
                cleanup_failures: 0,
                publish_failures: 0,
                late: None,
            }
        };
        let pending = &mut self.pending;
        let manifest = match crate::error::catch_panic(|| "writing a checkpoint".into(), || pending.write()) {
            Ok(m) => m,
            Err(e) => return failed(e, self.commit),
        };
        let written = began.elapsed();
        let engine = Arc::clone(self.pending.engine());
        // The sink is the only committer of checkpoints: it reads the newest
        // version.
        self.commit.checkpoint = Some(CheckpointRecord {
            manifest,
            input: self.input,
            position: self.resume,
            source_state: self.source_state,
        });
        let epoch = engine.clock().epoch();
        if let Err(e) = self.catalog.version().and_then(|v| self.catalog.commit(epoch, v, &self.commit)) {
            return failed(e, self.commit);
        }
        let Some(record) = self.commit.checkpoint else { unreachable!("set above") };
        engine.checkpoint_committed(&record.manifest);
        // Committed: the keys it wrote are not owed to the next one.
        drop(self.pending);
        let committed = began.elapsed() - written;
        // Published for readers on other hosts (monotonic, fenced).
        let late = engine.clock().persist_watermarks().err();
        // The checkpoint is committed: clean-up that fails now is retried by
        // a later checkpoint or GC round (and a restore deletes whatever the
        // manifest does not name), so it does not stop the replay.
        let mut cleanup_failures = 0;
        if let Err(e) = engine.drop_old_checkpoints(&record.manifest) {
            cleanup_failures += 1;
            tracing::warn!("objects of older checkpoints stay until the next checkpoint: {e}");
        }
        if let Some(retention) = &self.prune {
            match self.catalog.prune(epoch, retention) {
                Ok(p) if p != crate::catalog::Pruned::default() => {
                    tracing::info!(versions = p.versions, history = p.history, objects = p.objects, "catalog pruned")
                }
                Ok(_) => {}
                Err(e) => {
                    cleanup_failures += 1;
                    tracing::warn!("catalog history past the retention stays until the next prune: {e}");
                }
            }
        }
        // Published elsewhere: a failure leaves the checkpoint committed and
        // the publication behind until the next checkpoint's.
        let mut publish_failures = 0;
        if let Some(publisher) = &self.publisher {
            // A publisher's panic is one more failure of it, not the
            // replay's: the checkpoint stands.
            let published = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| publisher.publish(&record)))
                .unwrap_or_else(|_| Err("the publisher panicked".into()));
            if let Err(e) = published {
                publish_failures += 1;
                tracing::warn!(checkpoint_ts = record.manifest.checkpoint_ts, "checkpoint not published: {e}");
            }
        }
        CheckpointOutcome {
            result: Ok(record.manifest),
            commit: CatalogCommit::default(),
            written,
            committed,
            cleanup_failures,
            publish_failures,
            late,
        }
    }
}

impl Sink {
    /// Writes a checkpoint when one is due, in the background (see
    /// [`Self::start_checkpoint`]), and commits one written meanwhile;
    /// with `force`, writes one now and waits until it is committed.
    pub fn maybe_checkpoint(&mut self, next: SourcePosition, force: bool) -> Result<()> {
        if force {
            return self.checkpoint_with(next, &mut |_| Ok(None));
        }
        self.finish_checkpoint(false)?;
        let due = self.since_checkpoint >= self.config.checkpoint_txns
            || (self.since_checkpoint > 0 && self.checkpoint_due.is_some_and(|due| Instant::now() >= due));
        if due {
            self.start_checkpoint(next, &mut |_| Ok(None))?;
        }
        Ok(())
    }

    /// Writes a checkpoint now and waits until it is committed (after the
    /// one being written, if any), resuming at `next` or at the first record
    /// still pending, whichever is earlier; `state` gives the input's state
    /// for the position the checkpoint resumes at (`None`: the state set
    /// with [`Self::set_source_state`]). A source that hands whole
    /// transactions over (Kinesis) needs the position: after a failed
    /// transaction, the checkpoint resumes before it.
    pub fn checkpoint_with(
        &mut self,
        next: SourcePosition,
        state: &mut dyn FnMut(SourcePosition) -> Result<Option<String>>,
    ) -> Result<()> {
        self.take_deferred()?;
        self.finish_checkpoint(true)?;
        // Nothing runs beside it: its shards are written at once.
        self.begin_checkpoint(next, state, true)?;
        self.finish_checkpoint(true)
    }

    /// The catalog pruning the next checkpoint does, if one is due (and
    /// when the one after is).
    pub(super) fn take_prune(&mut self) -> Option<crate::catalog::Retention> {
        let retention = self.config.history_retention?;
        let now = Instant::now();
        if now < self.prune_due {
            return None;
        }
        self.prune_due = now + prune_interval(retention);
        Some(crate::catalog::Retention::older_than(retention, self.config.dedup_window))
    }

    /// The publisher, for a checkpoint about to be written when a
    /// publication is due (or the caller waits for the checkpoint).
    fn take_publisher(&mut self, waited_for: bool) -> Option<Arc<dyn super::CheckpointPublisher>> {
        let publisher = self.config.publisher.clone()?;
        let now = Instant::now();
        if !waited_for && now < self.publish_due {
            return None;
        }
        self.publish_due = now.checked_add(self.config.publish_interval).unwrap_or(now);
        Some(publisher)
    }

    /// True while a checkpoint is being written in the background.
    pub fn checkpoint_in_flight(&self) -> bool {
        self.writing.is_some()
    }

    /// Captures a checkpoint of everything handed to the shards (after
    /// waiting until they applied it) and writes it on a background
    /// thread while replay goes on; [`Self::poll_checkpoint`] commits it
    /// once written. Resumes at `next` or at the first record still
    /// pending, whichever is earlier (`state` as in
    /// [`Self::checkpoint_with`]). Returns false, doing nothing, while
    /// another is being written.
    pub fn start_checkpoint(
        &mut self,
        next: SourcePosition,
        state: &mut dyn FnMut(SourcePosition) -> Result<Option<String>>,
    ) -> Result<bool> {
        self.begin_checkpoint(next, state, false)
    }

    /// [`Self::start_checkpoint`]; with `waited_for`, the caller waits for
    /// it with nothing else to run, and its shards are written at once
    /// ([`crate::checkpoint::PendingCheckpoint::write_shards_at_once`]).
    pub(super) fn begin_checkpoint(
        &mut self,
        next: SourcePosition,
        state: &mut dyn FnMut(SourcePosition) -> Result<Option<String>>,
        waited_for: bool,
    ) -> Result<bool> {
        if self.writing.is_some() {
            return Ok(false);
        }
        // Everything handed to the shards is applied and committed first;
        // after a failure the image stops before the failing transaction.
        let drained = self.drain();
        let mut resume = next;
        if let Some(o) = &self.open {
            resume = resume.min(o.first);
        }
        if let Some((_, first)) = self.failed_at {
            resume = resume.min(first);
        }
        for rows in self.held.values() {
            if let Some((p, _)) = rows.first() {
                resume = resume.min(*p);
            }
        }
        if self.failed_at.is_none() {
            drained?;
        }
        if let Some(at) = state(resume)? {
            self.source_state = Some(at);
        }
        let began = Instant::now();
        let mut pending = self.engine.capture_checkpoint()?;
        if waited_for {
            pending.write_shards_at_once();
        }
        let captured = began.elapsed();
        // History and operations up to here belong to this checkpoint; they
        // come back if it fails (a later checkpoint still owes them).
        let job = CheckpointJob {
            pending,
            catalog: Arc::clone(&self.catalog),
            commit: CatalogCommit {
                operations: std::mem::take(&mut self.operations),
                history: std::mem::take(&mut self.history),
                checkpoint: None,
            },
            input: self.input.clone(),
            resume,
            source_state: self.source_state.clone(),
            prune: self.take_prune(),
            publisher: self.take_publisher(waited_for),
        };
        let thread = std::thread::Builder::new().name("fovea-checkpoint".into()).spawn(move || job.run())?;
        self.writing = Some(CheckpointInFlight { thread, resume, began, captured });
        self.since_checkpoint = 0;
        self.checkpoint_due = Instant::now().checked_add(self.config.checkpoint_interval);
        Ok(true)
    }

    /// Finishes the checkpoint being written if it is written (without
    /// waiting); returns how long it took from capture to commit when one
    /// was committed since the last call (now, or while records were
    /// pushed). An error (writing or committing failed) leaves the previous
    /// checkpoint in force and everything it owed to the next.
    pub fn poll_checkpoint(&mut self) -> Result<Option<Duration>> {
        self.take_deferred()?;
        self.finish_checkpoint(false)?;
        Ok(self.unreported.take())
    }

    /// Commits the checkpoint being written, once written (`wait`: waiting
    /// for that); its time goes to `unreported`.
    pub(super) fn finish_checkpoint(&mut self, wait: bool) -> Result<()> {
        match &self.writing {
            None => return Ok(()),
            Some(w) if !wait && !w.thread.is_finished() => return Ok(()),
            Some(_) => {}
        }
        let CheckpointInFlight { thread, resume, began, captured } =
            self.writing.take().unwrap_or_else(|| unreachable!("matched Some"));
        let outcome = thread.join().map_err(|_| Error::invariant("the checkpoint writer panicked"))?;
        let manifest = match outcome.result {
            Ok(m) => m,
            Err(e) => {
                // Owed to the next checkpoint, before what came since.
                let CatalogCommit { mut operations, mut history, .. } = outcome.commit;
                operations.append(&mut self.operations);
                self.operations = operations;
                history.append(&mut self.history);
                self.history = history;
                // A publication it was to make is made by the next.
                self.publish_due = Instant::now();
                return Err(e);
            }
        };
        self.checkpointed_at = Some(resume);
        self.stats.cleanup_failures += outcome.cleanup_failures;
        self.stats.publish_failures += outcome.publish_failures;
        if outcome.publish_failures > 0 {
            self.publish_due = Instant::now();
        }
        if let Some(e) = outcome.late {
            return Err(e);
        }
        if self.config.maintain_on_checkpoint {
            if let Err(e) = self.engine.gc() {
                self.stats.cleanup_failures += 1;
                tracing::warn!("memory GC after the checkpoint failed; the next round retries: {e}");
            }
            self.engine.combine()?;
        }
        tracing::debug!(
            ts = manifest.checkpoint_ts,
            capture_ms = captured.as_secs_f64() * 1e3,
            write_ms = outcome.written.as_secs_f64() * 1e3,
            commit_ms = outcome.committed.as_secs_f64() * 1e3,
            total_ms = began.elapsed().as_secs_f64() * 1e3,
            "checkpoint"
        );
        self.stats.checkpoints += 1;
        self.unreported = Some(began.elapsed());
        Ok(())
    }
}
