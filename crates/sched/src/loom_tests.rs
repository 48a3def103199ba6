//! Loom models of the lock-free coordination (run with `RUSTFLAGS="--cfg loom"`).
//!
//! Loom explores the interleavings of the real protocol code (queue size, slot reservations,
//! waiting counters, bucket counts, epoch, idle-worker gate) and of the growing FIFOs of the
//! tasks and spill queues (their mutexes are loom's); only the buckets' lock-free rings are
//! stand-ins, loom-visible mutex queues (see `fifo.rs`). Each model is small: loom's cost grows exponentially with the
//! number of synchronisation points.

use crate::bucket::BucketQueue;
use crate::clock::Clock;
use crate::config::SchedConfig;
use crate::core::{Core, Step};
use crate::history::recording::{stamp, RecordingFifo, Stamped};
use crate::history::{check_history, GetRecord, PutRecord};
use crate::sync::Arc;
use crate::task::Task;
use loom::thread;
use std::sync::atomic::{AtomicU64, Ordering};

/// Runs `f` under loom with a preemption bound of 3 unless `LOOM_MAX_PREEMPTIONS` says otherwise.
fn model<F: Fn() + Sync + Send + 'static>(f: F) {
    let mut builder = loom::model::Builder::new();
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = Some(3);
    }
    builder.check(f);
}

/// A clock that moves one tick at every reading: each event "costs" at least one tick, so credits
/// run out and resets happen inside small models. A std atomic: time is an input, not a
/// synchronisation point under test.
struct TickClock(AtomicU64);

impl Clock for TickClock {
    fn now_ns(&self) -> u64 {
        self.0.fetch_add(1, Ordering::SeqCst)
    }
}

/// What handlers saw: (task, event) in the order they ran. A std mutex (no loom point inside a
/// critical section, so it can never be held across a loom context switch).
type Log = std::sync::Arc<std::sync::Mutex<Vec<(u64, u32)>>>;

/// A core that runs one event per dispatch (the paper's Fig. 1b), the models' default.
fn new_core(period_ns: u64, bucket_count: usize, capacity: usize) -> Arc<Core<u32>> {
    new_core_with_burst(period_ns, bucket_count, capacity, 0)
}

/// A core whose workers run bursts of up to `burst_ns` clock ticks (each clock read is a tick).
fn new_core_with_burst(
    period_ns: u64,
    bucket_count: usize,
    capacity: usize,
    burst_ns: u64,
) -> Arc<Core<u32>> {
    let config = SchedConfig {
        burst_ns,
        period_ns,
        bucket_count,
        bucket_group_size: Some(2),
        worker_threads: 0,
        task_queue_capacity: capacity,
        // Rings of one task: a second task in the same bucket takes the spill path.
        bucket_ring_capacity: 1,
        ..SchedConfig::default()
    };
    let clock: std::sync::Arc<dyn Clock> = std::sync::Arc::new(TickClock(AtomicU64::new(0)));
    Arc::new(Core::new(&config, clock))
}

fn logging_task(core: &Core<u32>, share: f64, log: &Log) -> Arc<Task<u32>> {
    let log = log.clone();
    let task_id = core.new_task(share, Box::new(|_| {})).id + 1; // ids are dense: the next one
    core.new_task(
        share,
        Box::new(move |event| {
            log.lock()
                .unwrap_or_else(|e| e.into_inner())
                .push((task_id, event));
        }),
    )
}

fn events_of(log: &Log, task: u64) -> Vec<u32> {
    log.lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .filter(|(t, _)| *t == task)
        .map(|(_, e)| *e)
        .collect()
}

/// Runs steps until the set is empty; the final check that no task with events was lost.
fn drain(core: &Core<u32>) {
    let mut steps = 0;
    while core.step() != Step::Idle {
        steps += 1;
        assert!(steps < 100, "scheduler does not converge");
    }
}

/// Fig. 2: a writer pushes while a worker runs the task. No event is lost or duplicated, order is
/// kept, and when everything ran the task is out of the set with a zero queue size.
#[test]
fn loom_writer_and_worker_lose_no_task() {
    model(|| {
        let core = new_core(1_000, 2, 2);
        let log = Log::default();
        let task = logging_task(&core, 0.5, &log);
        let writer = {
            let (core, task) = (core.clone(), task.clone());
            thread::spawn(move || {
                for event in [1, 2] {
                    assert!(core.try_push(&task, event).is_ok());
                }
            })
        };
        let worker = {
            let core = core.clone();
            thread::spawn(move || {
                core.step();
                core.step();
            })
        };
        writer.join().expect("writer");
        worker.join().expect("worker");
        drain(&core);
        assert_eq!(events_of(&log, task.id), vec![1, 2]);
        assert_eq!(task.queue_size(), 0);
    });
}

/// Two workers and a writer on one task: the handler's `try_lock` panics on a double dispatch,
/// and the order of the task's events is kept.
#[test]
fn loom_two_workers_never_run_one_task_twice() {
    model(|| {
        let core = new_core(1_000, 2, 2);
        let log = Log::default();
        let task = logging_task(&core, 0.5, &log);
        assert!(core.try_push(&task, 1).is_ok());
        let writer = {
            let (core, task) = (core.clone(), task.clone());
            thread::spawn(move || assert!(core.try_push(&task, 2).is_ok()))
        };
        let workers: Vec<_> = (0..2)
            .map(|_| {
                let core = core.clone();
                thread::spawn(move || {
                    core.step();
                })
            })
            .collect();
        writer.join().expect("writer");
        for worker in workers {
            worker.join().expect("worker");
        }
        drain(&core);
        assert_eq!(events_of(&log, task.id), vec![1, 2]);
    });
}

/// A writer blocked on a full queue is woken by the worker that drains it to half its capacity,
/// and an idle worker is woken by the writer whose push makes the task schedulable: neither
/// wake-up can be lost (loom reports a deadlock if one is).
fn no_lost_wake_up(capacity: usize, events: u32, burst_ns: u64) {
    model(move || {
        let core = new_core_with_burst(1_000, 2, capacity, burst_ns);
        let log = Log::default();
        let task = logging_task(&core, 0.5, &log);
        let writer = {
            let (core, task) = (core.clone(), task.clone());
            thread::spawn(move || {
                for event in 1..=events {
                    assert!(core.push_blocking(&task, event).is_ok());
                }
            })
        };
        let worker = {
            let (core, task) = (core.clone(), task.clone());
            thread::spawn(move || {
                // A step may run a burst of several events: count what the task ran.
                while task.counters.events_run.load(Ordering::SeqCst) < u64::from(events) {
                    match core.step() {
                        // Nothing to do: sleep; if it returns at once, a put is in flight, so let
                        // it finish (the production loop backs off the same way).
                        Step::Idle if !core.wait_for_work() => thread::yield_now(),
                        _ => {}
                    }
                }
            })
        };
        writer.join().expect("writer");
        worker.join().expect("worker");
        assert_eq!(events_of(&log, task.id), (1..=events).collect::<Vec<_>>());
        assert_eq!(core.step(), Step::Idle);
    });
}

/// Capacity 1: the writer is woken by every event taken.
#[test]
fn loom_no_lost_wake_up_capacity_1() {
    no_lost_wake_up(1, 2, 0);
}

/// Bursts (each clock read a tick, so up to three events per dispatch): the worker reads the
/// queue size again when its snapshot is used up and takes events pushed meanwhile, and still
/// neither loses a wake-up nor an event.
#[test]
fn loom_no_lost_wake_up_with_bursts() {
    no_lost_wake_up(2, 3, 3);
}

/// Capacity 3: the writer blocks on the fourth event and is woken only when the queue is down to
/// one event (the half-capacity hysteresis).
#[test]
fn loom_no_lost_wake_up_capacity_3_hysteresis() {
    no_lost_wake_up(3, 4, 0);
}

/// Two workers over two tasks whose credit runs out: resets race with running tasks. Every event
/// runs once and in order, and afterwards no task holds more than a full period of credit or a
/// credit from a future epoch.
#[test]
fn loom_reset_and_epoch_correction() {
    model(|| {
        // Period 4 ticks, two levels; share 0.5 gives 2 ticks: a task runs out after its first
        // event or two, so resets happen while the other worker is busy.
        let core = new_core(4, 2, 2);
        let log = Log::default();
        let tasks = [
            logging_task(&core, 0.5, &log),
            logging_task(&core, 0.5, &log),
        ];
        for task in &tasks {
            for event in [1, 2] {
                assert!(core.try_push(task, event).is_ok());
            }
        }
        let workers: Vec<_> = (0..2)
            .map(|_| {
                let core = core.clone();
                thread::spawn(move || {
                    core.step();
                    core.step();
                })
            })
            .collect();
        for worker in workers {
            worker.join().expect("worker");
        }
        drain(&core);
        for task in &tasks {
            assert_eq!(events_of(&log, task.id), vec![1, 2]);
            assert!(
                task.credit_ns() <= 2,
                "credit {} above a full period",
                task.credit_ns()
            );
            assert!(task.credit_epoch() <= core.epoch());
        }
    });
}

type RecordingQueue = BucketQueue<Stamped, RecordingFifo, RecordingFifo>;

/// The bucket queue under concurrent puts and gets: nothing lost or duplicated, and the recorded
/// history satisfies the section III-D invariant.
#[test]
fn loom_bucket_queue_keeps_the_iii_d_invariant() {
    bucket_queue_model(2, [(1, 0), (2, 1)]);
}

/// The same with rings of one item and two puts into one bucket: the second (or the first, if a
/// getter took element 0 already) goes to the spill queue, racing with gets of the ring and the
/// spill queue.
#[test]
fn loom_bucket_queue_spill_keeps_the_iii_d_invariant() {
    bucket_queue_model(1, [(1, 2), (2, 0)]);
}

/// Element 0 is put into bucket 2 first; a putter thread then puts `puts` (element, bucket) while
/// two getters take one element each; the rest is drained.
fn bucket_queue_model(ring_capacity: usize, puts_of_putter: [(u64, usize); 2]) {
    model(move || {
        // Buckets 0 (best) .. 2, groups of 2: [0, 1] [2].
        let queue: Arc<RecordingQueue> = Arc::new(BucketQueue::new(3, 2, ring_capacity));
        let prio = |bucket: usize| 3 - bucket as i64;
        let start = stamp();
        queue.put(Stamped::new(0), 2);
        let mut puts = vec![(0u64, 2usize, start)];
        let putter = {
            let queue = queue.clone();
            thread::spawn(move || {
                let mut mine = Vec::new();
                for (element, bucket) in puts_of_putter {
                    let start = stamp();
                    queue.put(Stamped::new(element), bucket);
                    mine.push((element, bucket, start));
                }
                mine
            })
        };
        let getters: Vec<_> = (0..2)
            .map(|_| {
                let queue = queue.clone();
                thread::spawn(move || {
                    let start = stamp();
                    queue.get().map(|(item, _)| (start, item))
                })
            })
            .collect();
        puts.extend(putter.join().expect("putter"));
        let mut got = Vec::new();
        for getter in getters {
            got.extend(getter.join().expect("getter"));
        }
        loop {
            let start = stamp();
            let Some((item, _)) = queue.get() else { break };
            got.push((start, item));
        }
        assert_eq!(got.len(), 3, "every element is got exactly once");
        let put_records: Vec<PutRecord> = puts
            .iter()
            .map(|&(element, bucket, start)| {
                let end = got
                    .iter()
                    .find(|(_, item)| item.element == element)
                    .map(|(_, item)| item.pushed_at);
                let Some(end) = end else {
                    panic!("element {element} lost")
                };
                PutRecord {
                    element,
                    prio: prio(bucket),
                    start,
                    end,
                }
            })
            .collect();
        let get_records: Vec<GetRecord> = got
            .iter()
            .map(|(start, item)| {
                let put = put_records.iter().position(|p| p.element == item.element);
                let Some(put) = put else {
                    panic!("unknown element {}", item.element)
                };
                GetRecord {
                    put,
                    start: *start,
                    end: item.popped_at,
                }
            })
            .collect();
        assert_eq!(check_history(&put_records, &get_records), Ok(()));
    });
}

/// The growing FIFO under the tasks and spill queues: two writers and a reader that swaps the
/// writers' deque for its own drained one. Nothing is lost or duplicated and each writer's
/// items come out in the order it pushed them, in every interleaving.
#[test]
fn loom_growing_fifo_loses_nothing_and_keeps_each_writers_order() {
    use crate::fifo::{Fifo, GrowingFifo};
    model(|| {
        let fifo = Arc::new(GrowingFifo::with_capacity(8));
        let writers: Vec<_> = (0..2u32)
            .map(|w| {
                let fifo = Arc::clone(&fifo);
                thread::spawn(move || {
                    fifo.push(w * 10);
                    fifo.push(w * 10 + 1);
                })
            })
            .collect();
        let mut seen = Vec::new();
        // Pops race with the pushes: some find the queue empty.
        for _ in 0..2 {
            if let Some(item) = fifo.pop() {
                seen.push(item);
            }
        }
        for w in writers {
            w.join().expect("writer");
        }
        while let Some(item) = fifo.pop() {
            seen.push(item);
        }
        let mut sorted = seen.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, vec![0, 1, 10, 11], "lost or duplicated: {seen:?}");
        for w in 0..2u32 {
            let mine: Vec<u32> = seen.iter().copied().filter(|i| i / 10 == w).collect();
            assert_eq!(
                mine,
                vec![w * 10, w * 10 + 1],
                "writer {w} out of order: {seen:?}"
            );
        }
    });
}

/// The chain of rings between a publisher and the core thread: the consumer pops while the
/// producer fills a ring of one, links a ring of two and fills it; every item arrives once and
/// in order, whichever way the pops interleave with the linking.
#[test]
fn loom_ring_chain_keeps_order_across_growth() {
    use crate::handoff::ring_chain_from;
    model(|| {
        let (mut tx, mut rx) = ring_chain_from::<u32>(1, 2);
        let producer = thread::spawn(move || {
            for i in 0..3 {
                assert_eq!(tx.push(i), Ok(()), "room for 1 + 2");
            }
        });
        let mut seen = Vec::new();
        for _ in 0..3 {
            if let Some(item) = rx.pop() {
                seen.push(item);
            }
        }
        producer.join().expect("producer");
        while let Some(item) = rx.pop() {
            seen.push(item);
        }
        assert_eq!(seen, vec![0, 1, 2]);
    });
}

/// The ready-list handshake: a producer queues two items, marking after each; the consumer,
/// concurrently, serves the producer once if it finds it listed (drain, clear the flag, look
/// again). Whatever the interleaving, once both are done an item still queued is never
/// orphaned: the producer's flag is set and its entry is on the list (or the overflow mark).
#[test]
fn loom_ready_list_never_orphans_queued_work() {
    use crate::handoff::{ring_chain_from, ReadyFlag, ReadyList};
    model(|| {
        let list = Arc::new(ReadyList::with_capacity(2));
        let flag = Arc::new(ReadyFlag::new());
        list.adopt(&flag, 0);
        let (mut tx, mut rx) = ring_chain_from::<u32>(2, 2);
        assert!(!list.finish(&flag, || rx.is_empty()), "nothing queued yet");
        let producer = {
            let (list, flag) = (Arc::clone(&list), Arc::clone(&flag));
            thread::spawn(move || {
                for i in 0..2 {
                    assert_eq!(tx.push(i), Ok(()));
                    list.mark(&flag);
                }
            })
        };
        let consumer = {
            let (list, flag) = (Arc::clone(&list), Arc::clone(&flag));
            thread::spawn(move || {
                let mut seen = Vec::new();
                if list.pop().is_some() || list.take_overflow() {
                    loop {
                        while let Some(item) = rx.pop() {
                            seen.push(item);
                        }
                        if !list.finish(&flag, || rx.is_empty()) {
                            break;
                        }
                    }
                }
                (rx, seen)
            })
        };
        producer.join().expect("producer");
        let (mut rx, mut seen) = consumer.join().expect("consumer");
        if !rx.is_empty() {
            assert!(flag.is_set(), "queued work with the flag clear: {seen:?}");
            assert!(
                list.pop().is_some() || list.take_overflow(),
                "queued work with no entry: {seen:?}"
            );
        }
        while let Some(item) = rx.pop() {
            seen.push(item);
        }
        assert_eq!(seen, vec![0, 1]);
    });
}
