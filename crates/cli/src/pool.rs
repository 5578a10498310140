//! Reused threads for the service's per-execution work: an execution used
//! to start two threads (the one following it and the one preparing and
//! running it) and end them, each a stack mapped, faulted in and unmapped;
//! a thread that finished its job now waits for the next one instead.
//!
//! A job runs on a thread that ran other jobs before: nothing the service
//! runs on these threads leaves per-thread state behind (the supervisor
//! restores the signal mask it blocks; no thread-locals hold an
//! execution's data), and a job's own values are dropped when it returns.

use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Mutex;

type Job = Box<dyn FnOnce() + Send + 'static>;

/// Idle threads waiting for a job, each by the sending end of its queue.
static IDLE: Mutex<Vec<Sender<Job>>> = Mutex::new(Vec::new());

/// Threads kept waiting at most; one more ends after its job (a burst of
/// concurrent executions does not leave its threads behind for good).
const MAX_IDLE: usize = 8;

/// The end of one job: [`Finished::join`] waits for it.
pub struct Finished(Receiver<()>);

impl Finished {
    /// Waits until the job returned.
    pub fn join(self) {
        let _ = self.0.recv();
    }
}

/// Runs `job` on an idle thread, or a new one when none is idle. Err: no
/// thread could be started (`job` is dropped unrun).
pub fn run(job: impl FnOnce() + Send + 'static) -> std::io::Result<Finished> {
    let (done_tx, done) = channel::<()>();
    let mut job: Job = Box::new(move || {
        job();
        drop(done_tx);
    });
    loop {
        let idle = IDLE.lock().unwrap_or_else(|p| p.into_inner()).pop();
        let Some(worker) = idle else { break };
        // An idle thread waits on its queue until it gets a job, so this
        // fails only if it is gone; then the next one is asked.
        match worker.send(job) {
            Ok(()) => return Ok(Finished(done)),
            Err(back) => job = back.0,
        }
    }
    std::thread::Builder::new()
        .name("moat-worker".into())
        .spawn(move || work(job))?;
    Ok(Finished(done))
}

/// A worker's life: its first job, then each job sent to it while idle,
/// until more than [`MAX_IDLE`] threads would wait.
fn work(first: Job) {
    first();
    let (tx, queue) = channel::<Job>();
    loop {
        {
            let mut idle = IDLE.lock().unwrap_or_else(|p| p.into_inner());
            if idle.len() >= MAX_IDLE {
                return;
            }
            idle.push(tx.clone());
        }
        // Its sender is in IDLE (or taken with a job on the way) and this
        // thread holds `tx`: the queue cannot disconnect.
        match queue.recv() {
            Ok(job) => job(),
            Err(_) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jobs_run_reuse_threads_and_join_waits() {
        let (tx, rx) = channel();
        let first = {
            let tx = tx.clone();
            run(move || tx.send(std::thread::current().id()).unwrap()).unwrap()
        };
        first.join();
        let a = rx.recv().unwrap();
        // The thread is back in the idle list after its job returns.
        for _ in 0..1000 {
            if !IDLE.lock().unwrap().is_empty() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let flag = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let set = flag.clone();
        let second = run(move || {
            std::thread::sleep(std::time::Duration::from_millis(20));
            set.store(true, std::sync::atomic::Ordering::SeqCst);
            tx.send(std::thread::current().id()).unwrap();
        })
        .unwrap();
        second.join();
        assert!(flag.load(std::sync::atomic::Ordering::SeqCst));
        assert_eq!(rx.recv().unwrap(), a, "an idle thread takes the next job");
    }
}
