//! A worker thread that runs submitted jobs in order: how calls become
//! asynchronous without an async runtime. The thread starts on first use and
//! ends when its owner is dropped and the queued jobs are done.

use std::sync::OnceLock;
use std::sync::mpsc::{Sender, channel};

/// A boxed job.
pub(crate) type Job = Box<dyn FnOnce() + Send + 'static>;

/// One worker thread fed through a channel.
#[derive(Default)]
pub(crate) struct Lane {
    tx: OnceLock<Option<Sender<Job>>>,
    name: &'static str,
}

impl Lane {
    /// A lane whose thread will be called `name`.
    pub(crate) fn new(name: &'static str) -> Lane {
        Lane { tx: OnceLock::new(), name }
    }

    /// Queues `job`; returns it back if no thread could be started (the caller
    /// then runs it inline). Costs a channel send; the thread spawn once.
    pub(crate) fn submit(&self, job: Job) -> Result<(), Job> {
        let tx = self.tx.get_or_init(|| {
            let (tx, rx) = channel::<Job>();
            let spawned = std::thread::Builder::new().name(self.name.into()).spawn(move || {
                for job in rx {
                    // A panicking job drops its completer, which reports the error;
                    // the lane keeps serving the next jobs.
                    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
                }
            });
            spawned.ok().map(|_| tx)
        });
        match tx {
            Some(tx) => tx.send(job).map_err(|e| e.0),
            None => Err(job),
        }
    }
}
