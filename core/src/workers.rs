//! Shard worker threads with group commit.
//!
//! ```text
//!  sink ─submit(ts, ops)─▶ route by hash(table, key) ─▶ per-shard pending jobs ─┐
//!       ─commit(ts)──────▶ a commit marker for every shard the ts touched ──────┤ group: one push
//!                                                                                ▼ per shard per group
//!  worker s: [Apply ts1][Apply ts1][Commit ts1][Apply ts2][Commit ts2] …   (FIFO = ts order)
//!            the last worker to reach a ts's marker commits it ─▶ HWM advances
//! ```
//!
//! Each shard has one worker and a FIFO queue, so a shard applies its
//! operations in timestamp order (the ordered-deletes invariant holds).
//! Jobs are gathered per shard and pushed as a group ([`ShardPool::flush`]),
//! so small transactions do not pay one synchronisation each.
//!
//! A shard that fails validation stops applying and the pool reports the
//! error; parts of that transaction (and of later ones) that other shards
//! applied are never committed, so no query sees them and no checkpoint
//! (an image at HWM − 1) contains them.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::ids::Ts;
use crate::mvcc::lock;
use crate::replay::{Op, ShardOp};

enum Job {
    Apply { chunk: u64, ts: Ts, ops: Vec<ShardOp>, origins: Vec<usize> },
    Commit { ts: Ts, remaining: Arc<AtomicUsize> },
}

/// The error a worker hit, with the chunk and the operation in it.
#[derive(Debug)]
pub struct WorkerError {
    /// The chunk (as numbered by [`ShardPool::submit`]).
    pub chunk: u64,
    /// Its timestamp.
    pub ts: Ts,
    /// The error.
    pub error: Error,
}

struct Queue {
    jobs: Mutex<VecDeque<Job>>,
    ready: Condvar,
}

struct Shared {
    queues: Vec<Queue>,
    inflight: Mutex<Inflight>,
    /// Notified when the jobs in flight fall to 0, or to `wake_at` or below.
    drained: Condvar,
    /// Smallest ts a worker failed on (`u64::MAX`: none). Work below it
    /// goes on, so transactions before the failure still commit.
    failed_ts: AtomicU64,
    failed: AtomicBool,
    error: Mutex<Option<WorkerError>>,
    stop: AtomicBool,
}

struct Inflight {
    /// Jobs pushed and not yet finished.
    jobs: usize,
    /// The count a waiter in [`ShardPool::flush_and_wait_for`] waits for
    /// (0 when none waits: only a drain is woken).
    wake_at: usize,
}

struct Pending {
    jobs: Vec<Vec<Job>>,
    count: usize,
    next_chunk: u64,
    /// Shards each uncommitted ts has touched.
    touched: HashMap<Ts, Vec<bool>>,
}

/// One worker thread per shard of an engine.
pub struct ShardPool {
    engine: Arc<Engine>,
    shared: Arc<Shared>,
    pending: Mutex<Pending>,
    threads: Vec<JoinHandle<()>>,
}

impl ShardPool {
    /// Starts one worker per shard of `engine`.
    pub fn start(engine: Arc<Engine>) -> Result<Self> {
        let n = engine.config().shards;
        let shared = Arc::new(Shared {
            queues: (0..n).map(|_| Queue { jobs: Mutex::new(VecDeque::new()), ready: Condvar::new() }).collect(),
            inflight: Mutex::new(Inflight { jobs: 0, wake_at: 0 }),
            drained: Condvar::new(),
            failed_ts: AtomicU64::new(u64::MAX),
            failed: AtomicBool::new(false),
            error: Mutex::new(None),
            stop: AtomicBool::new(false),
        });
        let threads = (0..n)
            .map(|s| {
                let (engine, shared) = (Arc::clone(&engine), Arc::clone(&shared));
                std::thread::Builder::new().name(format!("fovea-shard-{s}")).spawn(move || work(s, &engine, &shared))
            })
            .collect::<std::io::Result<Vec<_>>>()?;
        let pending = Mutex::new(Pending {
            jobs: (0..n).map(|_| Vec::new()).collect(),
            count: 0,
            next_chunk: 0,
            touched: HashMap::new(),
        });
        Ok(ShardPool { engine, shared, pending, threads })
    }

    /// The first error a worker hit, if any (taken).
    pub fn take_error(&self) -> Option<WorkerError> {
        // Acquire: pairs with the Release when a worker records its error.
        if !self.shared.failed.load(Ordering::Acquire) {
            return None;
        }
        lock(&self.shared.error).take()
    }

    /// Queues `ops` at `ts` (one chunk of a transaction; a transaction may
    /// have several). Returns the chunk number errors will name.
    pub fn submit(&self, ts: Ts, ops: Vec<Op>) -> Result<u64> {
        let (routed, origins) = self.engine.route(ops)?;
        let mut p = lock(&self.pending);
        let chunk = p.next_chunk;
        p.next_chunk += 1;
        let shards = routed.len();
        let mut touched = p.touched.remove(&ts).unwrap_or_else(|| vec![false; shards]);
        for (s, (ops, origins)) in routed.into_iter().zip(origins).enumerate() {
            if ops.is_empty() {
                continue;
            }
            touched[s] = true;
            p.jobs[s].push(Job::Apply { chunk, ts, ops, origins });
            p.count += 1;
        }
        p.touched.insert(ts, touched);
        Ok(chunk)
    }

    /// Commits `ts` once every shard it touched has applied it.
    pub fn commit(&self, ts: Ts) -> Result<()> {
        let mut p = lock(&self.pending);
        let touched = p.touched.remove(&ts).unwrap_or_default();
        let shards: Vec<usize> = touched.iter().enumerate().filter(|(_, t)| **t).map(|(s, _)| s).collect();
        if shards.is_empty() {
            drop(p);
            return self.engine.commit(ts);
        }
        let remaining = Arc::new(AtomicUsize::new(shards.len()));
        for s in shards {
            p.jobs[s].push(Job::Commit { ts, remaining: Arc::clone(&remaining) });
            p.count += 1;
        }
        Ok(())
    }

    /// Jobs gathered and not yet handed to the workers.
    pub fn pending_jobs(&self) -> usize {
        lock(&self.pending).count
    }

    /// Hands the gathered jobs to the workers: one push per shard.
    pub fn flush(&self) {
        let mut p = lock(&self.pending);
        if p.count == 0 {
            return;
        }
        lock(&self.shared.inflight).jobs += p.count;
        p.count = 0;
        for (s, jobs) in p.jobs.iter_mut().enumerate() {
            if jobs.is_empty() {
                continue;
            }
            let q = &self.shared.queues[s];
            lock(&q.jobs).extend(jobs.drain(..));
            q.ready.notify_one();
        }
    }

    /// Hands the gathered jobs to the workers, then waits until at most
    /// `max_inflight` jobs are unfinished: the back-pressure that keeps a
    /// large transaction's operations from piling up in memory faster than
    /// the shards apply them. Errors are left for [`ShardPool::take_error`].
    pub fn flush_and_wait_for(&self, max_inflight: usize) {
        self.flush();
        let mut inflight = lock(&self.shared.inflight);
        if inflight.jobs <= max_inflight {
            return;
        }
        inflight.wake_at = max_inflight;
        // A failed pool skips its jobs, so they still finish.
        while inflight.jobs > max_inflight {
            inflight = self.shared.drained.wait(inflight).unwrap_or_else(|p| p.into_inner());
        }
        inflight.wake_at = 0;
    }

    /// Flushes and waits until every job is done. Returns a worker's error.
    pub fn drain(&self) -> std::result::Result<(), WorkerError> {
        self.flush();
        let mut inflight = lock(&self.shared.inflight);
        while inflight.jobs > 0 {
            inflight = self.shared.drained.wait(inflight).unwrap_or_else(|p| p.into_inner());
        }
        drop(inflight);
        match self.take_error() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

impl Drop for ShardPool {
    fn drop(&mut self) {
        let _ = self.drain();
        // Release: workers that see `stop` see every job pushed before it.
        self.shared.stop.store(true, Ordering::Release);
        for q in &self.shared.queues {
            let _guard = lock(&q.jobs);
            q.ready.notify_all();
        }
        for t in self.threads.drain(..) {
            if t.join().is_err() {
                tracing::error!("a shard worker panicked");
            }
        }
    }
}

fn work(s: usize, engine: &Engine, shared: &Shared) {
    let q = &shared.queues[s];
    loop {
        let batch: Vec<Job> = {
            let mut jobs = lock(&q.jobs);
            loop {
                if !jobs.is_empty() {
                    break jobs.drain(..).collect();
                }
                // Acquire: pairs with the Release in `ShardPool::drop`.
                if shared.stop.load(Ordering::Acquire) {
                    return;
                }
                jobs = q.ready.wait(jobs).unwrap_or_else(|p| p.into_inner());
            }
        };
        let n = batch.len();
        for job in batch {
            let ts = match &job {
                Job::Apply { ts, .. } | Job::Commit { ts, .. } => *ts,
            };
            // Relaxed: every job at or above a failed ts is skipped; a job
            // that slips through in the race is above HWM and never
            // committed (its commit marker is skipped or never completes).
            if ts.get() >= shared.failed_ts.load(Ordering::Relaxed) {
                continue;
            }
            // A panic is this job's error: the pool's waiters are told
            // instead of waiting forever for a dead thread.
            let result = match job {
                Job::Apply { chunk, ts, ops, origins } => {
                    let what = || format!("shard worker {s} applying ts {ts}");
                    crate::error::catch_panic(what, || {
                        #[cfg(test)]
                        tests::maybe_panic(ts);
                        engine.apply_on_shard(s, ts, &ops, &origins)
                    })
                    .map_err(|error| WorkerError { chunk, ts, error })
                }
                Job::Commit { ts, remaining } => {
                    // AcqRel: the last worker to arrive sees the others' writes
                    // (they happened before their decrement) before committing.
                    if remaining.fetch_sub(1, Ordering::AcqRel) == 1 {
                        crate::error::catch_panic(
                            || format!("shard worker {s} committing ts {ts}"),
                            || engine.commit(ts),
                        )
                        .map_err(|error| WorkerError { chunk: u64::MAX, ts, error })
                    } else {
                        Ok(())
                    }
                }
            };
            if let Err(e) = result {
                // Relaxed: the error slot below is the synchronisation point.
                shared.failed_ts.fetch_min(ts.get(), Ordering::Relaxed);
                let mut slot = lock(&shared.error);
                if slot.as_ref().is_none_or(|old| old.ts > ts) {
                    *slot = Some(WorkerError { ts, ..e });
                }
                // Release: pairs with the Acquire in `take_error`.
                shared.failed.store(true, Ordering::Release);
            }
        }
        let mut inflight = lock(&shared.inflight);
        inflight.jobs -= n;
        if inflight.jobs <= inflight.wake_at {
            shared.drained.notify_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::Duration;

    use arrow::datatypes::{DataType, Field, Schema};

    use super::*;
    use crate::engine::EngineConfig;
    use crate::schema::Value;

    /// The ts whose apply panics (0: none).
    static PANIC_AT: AtomicU64 = AtomicU64::new(0);

    pub(super) fn maybe_panic(ts: Ts) {
        // Relaxed: a test flag, set before the job is submitted.
        if PANIC_AT.load(Ordering::Relaxed) == ts.get() {
            panic!("injected panic at ts {ts}");
        }
    }

    #[test]
    fn a_panicking_worker_stops_the_pool_with_an_error() {
        let engine = Engine::in_memory(EngineConfig::default().with_shards(2)).unwrap();
        let schema = Schema::new(vec![Field::new("id", DataType::Int64, false)]);
        let t = engine.create_table("s.t", std::sync::Arc::new(schema), vec![0]).unwrap();
        let pool = ShardPool::start(std::sync::Arc::clone(&engine)).unwrap();
        let insert = |k: i64| Op::Insert { table: t.id, row: vec![Value::Int(k)] };
        let first = engine.begin().unwrap();
        pool.submit(first, vec![insert(1), insert(2)]).unwrap();
        pool.commit(first).unwrap();
        let second = engine.begin().unwrap();
        PANIC_AT.store(second.get(), Ordering::Relaxed);
        pool.submit(second, (10..20).map(insert).collect()).unwrap();
        pool.commit(second).unwrap();
        // drain returns (within a second) with the panic as the error.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(pool.drain().map_err(|e| (e.ts, e.error.to_string())));
        });
        let (ts, message) = rx.recv_timeout(Duration::from_secs(5)).expect("drain hung").unwrap_err();
        PANIC_AT.store(0, Ordering::Relaxed);
        assert_eq!(ts, second);
        assert!(message.contains("panicked: injected panic"), "{message}");
        // The transaction before it committed, the one that panicked did not.
        let visible: usize = engine
            .scan(&engine.snapshot(), "s.t", crate::ScanOptions::default())
            .unwrap()
            .collect_batches()
            .unwrap()
            .iter()
            .map(|b| b.num_rows())
            .sum();
        assert_eq!(visible, 2);
    }
}
