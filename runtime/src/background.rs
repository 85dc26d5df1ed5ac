//! Work nobody waits on — index passes, tree builds — run on threads at a lower CPU
//! priority, so on a busy machine it yields its cores to the work clients wait on (an
//! acknowledgement, a recall) instead of taking an equal share of them.
//!
//! Why it matters: a write is acknowledged by a chain of steps, each on one thread at a time
//! (embed, encode, commit). With index passes at the same priority, every step of that chain
//! shared a core with them on a two-core machine; at `nice` 10 a pass gets about a tenth of
//! a contended core (never none, so the indexes keep up under sustained load) and the whole
//! of an idle one. Recall never depends on a pass having run: it applies the change log to
//! the indexes' tails itself, at its own priority.

use std::sync::OnceLock;

/// Lowers the calling thread's CPU priority to `nice` 10 (Linux: per thread; threads it
/// starts inherit it). Failure only means the work competes at normal priority.
pub fn lower_priority() {
    #[cfg(target_os = "linux")]
    // SAFETY: plain syscalls on the calling thread's own id, no memory involved.
    unsafe {
        let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
        libc::setpriority(libc::PRIO_PROCESS, tid, 10);
    }
}

/// The threads background work runs on: a tokio runtime of its own whose threads all start
/// at the lower priority. Its blocking pool grows and shrinks with the work (a tree build
/// holds a thread for minutes while keyword passes keep coming), and a panic in the work
/// comes back through the join handle instead of ending the process.
fn pool() -> Option<&'static tokio::runtime::Runtime> {
    static POOL: OnceLock<Option<tokio::runtime::Runtime>> = OnceLock::new();
    POOL.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("shadowbrain-background")
            .on_thread_start(lower_priority)
            .build()
            .inspect_err(|e| {
                tracing::warn!(
                    error = %e,
                    "cannot start the background threads; background work runs at normal \
                     priority"
                );
            })
            .ok()
    })
    .as_ref()
}

/// Runs blocking `work` on a background thread; await the handle from any tokio runtime.
/// Where the background threads cannot start, it runs on the current runtime's blocking
/// pool, at normal priority.
///
/// # Panics
///
/// Outside a tokio runtime when the background threads could not be started.
pub fn spawn<R: Send + 'static>(
    work: impl FnOnce() -> R + Send + 'static,
) -> tokio::task::JoinHandle<R> {
    match pool() {
        Some(pool) => pool.spawn_blocking(work),
        None => tokio::task::spawn_blocking(work),
    }
}

/// Who waits on a piece of blocking work, and so the priority it runs at: the same work
/// (a condensation, a decay sweep) is background work when a trigger or a schedule starts
/// it, and a client's when the client asked for it and waits for the answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Priority {
    /// A client waits on it: the current runtime's blocking pool, at normal priority.
    Client,
    /// Nobody waits on it: [`spawn`]'s lowered threads.
    Background,
}

/// Runs blocking `work` at `priority`.
///
/// # Panics
///
/// Outside a tokio runtime, as [`spawn`] and `tokio::task::spawn_blocking`.
pub fn spawn_at<R: Send + 'static>(
    priority: Priority,
    work: impl FnOnce() -> R + Send + 'static,
) -> tokio::task::JoinHandle<R> {
    match priority {
        Priority::Client => tokio::task::spawn_blocking(work),
        Priority::Background => spawn(work),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The work runs on a thread at the lower priority, and a panic comes back as an error.
    #[tokio::test]
    async fn runs_lowered_and_reports_panics() {
        let nice = spawn(|| {
            // SAFETY: reads the calling thread's own priority.
            #[cfg(target_os = "linux")]
            unsafe {
                let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
                libc::getpriority(libc::PRIO_PROCESS, tid)
            }
            #[cfg(not(target_os = "linux"))]
            10
        })
        .await
        .expect("the work ran");
        assert_eq!(nice, 10);
        let panicked = spawn(|| -> u8 { panic!("injected") }).await;
        assert!(panicked.unwrap_err().is_panic());
    }
}
