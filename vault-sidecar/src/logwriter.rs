//! Log lines to stdout without a `write(2)` or a thread wake-up per line.
//!
//! Every intercepted request logs an audit line. Written synchronously, that line cost a `write(2)`
//! on the proxy's hot path; through `tracing-appender`'s channel it cost a wake-up of the writer
//! thread per line, and that thread's spin-then-park cycle (`sched_yield` ×4, two futex calls and a
//! `write` per request, measured with `strace -c`). Here lines are appended to a shared buffer; the
//! writer thread is woken only when the buffer goes from empty to non-empty and it is parked, then
//! waits [`FLUSH_DELAY`] so that the lines of that interval go out in one `write`.
//!
//! Nothing is dropped: when stdout can't keep up and [`MAX_PENDING`] bytes are waiting, writers
//! block until the thread has taken the buffer. Dropping the [`FlushGuard`] writes what is left.

use std::io::Write;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

/// How long the writer thread gathers lines after the first one of a batch.
pub const FLUSH_DELAY: Duration = Duration::from_millis(5);
/// Bytes waiting beyond which writers block (lossless backpressure).
pub const MAX_PENDING: usize = 4 << 20;

#[derive(Default)]
struct State {
    pending: Vec<u8>,
    /// The writer thread is parked on `wake` (so a writer must notify it).
    parked: bool,
    closing: bool,
}

#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    /// Signalled when `pending` becomes non-empty while the thread is parked, or on close.
    wake: Condvar,
    /// Signalled when the thread has taken `pending` (writers blocked on a full buffer).
    taken: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A `Write` (and `tracing_subscriber::fmt::MakeWriter`) handle; cheap to clone.
#[derive(Clone)]
pub struct BatchWriter {
    shared: Arc<Shared>,
}

/// Writes what is still pending and stops the writer thread when dropped.
pub struct FlushGuard {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

/// Start the writer thread for `out`; lines reach `out` within about `delay` of being written.
pub fn batched<W: Write + Send + 'static>(out: W, delay: Duration) -> std::io::Result<(BatchWriter, FlushGuard)> {
    let shared = Arc::new(Shared::default());
    let thread = std::thread::Builder::new().name("vault-sidecar-log".into()).spawn({
        let shared = shared.clone();
        move || drain(&shared, out, delay)
    })?;
    Ok((
        BatchWriter { shared: shared.clone() },
        FlushGuard {
            shared,
            thread: Some(thread),
        },
    ))
}

fn drain<W: Write>(shared: &Shared, mut out: W, delay: Duration) {
    // Two buffers swap roles, so steady-state logging allocates nothing.
    let mut batch = Vec::new();
    loop {
        let mut st = shared.lock();
        while st.pending.is_empty() && !st.closing {
            st.parked = true;
            st = shared.wake.wait(st).unwrap_or_else(|p| p.into_inner());
            st.parked = false;
        }
        if st.pending.is_empty() {
            return; // closing, nothing left
        }
        // Gather the lines of the next `delay` (cut short by close); writers don't notify meanwhile.
        let deadline = std::time::Instant::now() + delay;
        while !st.closing {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                break;
            }
            st = shared.wake.wait_timeout(st, left).unwrap_or_else(|p| p.into_inner()).0;
        }
        std::mem::swap(&mut st.pending, &mut batch);
        let closing = st.closing;
        drop(st);
        shared.taken.notify_all();
        // A failed write (stdout closed) has nowhere to be reported; the lines are gone either way.
        let _ = out.write_all(&batch).and_then(|()| out.flush());
        batch.clear();
        if closing && shared.lock().pending.is_empty() {
            return;
        }
    }
}

impl BatchWriter {
    /// Queue `buf` (whole lines) for stdout; waits only while [`MAX_PENDING`] bytes are waiting.
    pub fn append(&self, buf: &[u8]) {
        let mut st = self.shared.lock();
        while st.pending.len() >= MAX_PENDING && !st.closing {
            st = self.shared.taken.wait(st).unwrap_or_else(|p| p.into_inner());
        }
        st.pending.extend_from_slice(buf);
        let wake = st.parked && st.pending.len() == buf.len();
        drop(st);
        if wake {
            self.shared.wake.notify_one();
        }
    }
}

impl Write for BatchWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.append(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for BatchWriter {
    type Writer = BatchWriter;

    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

impl Drop for FlushGuard {
    fn drop(&mut self) {
        self.shared.lock().closing = true;
        self.shared.wake.notify_one();
        self.shared.taken.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::time::Instant;

    /// A `Write` into shared memory, counting the writes it receives.
    #[derive(Clone, Default)]
    struct Sink(Arc<Mutex<(Vec<u8>, usize)>>);

    impl Write for Sink {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            let mut s = self.0.lock().unwrap();
            s.0.extend_from_slice(buf);
            s.1 += 1;
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn lines_arrive_batched_and_whole() {
        let sink = Sink::default();
        let (writer, guard) = batched(sink.clone(), Duration::from_millis(50)).unwrap();
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let mut w = writer.clone();
                std::thread::spawn(move || {
                    for i in 0..250 {
                        w.write_all(format!("thread {t} line {i}\n").as_bytes()).unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        drop(guard);
        let (bytes, writes) = sink.0.lock().unwrap().clone();
        let text = String::from_utf8(bytes).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 1000);
        for t in 0..4 {
            let mine: Vec<&str> = lines
                .iter()
                .copied()
                .filter(|l| l.starts_with(&format!("thread {t} ")))
                .collect();
            let want: Vec<String> = (0..250).map(|i| format!("thread {t} line {i}")).collect();
            assert_eq!(mine, want, "thread {t}'s lines whole and in order");
        }
        assert!(writes < 100, "1000 lines took {writes} writes");
    }

    #[test]
    fn a_lone_line_is_written_after_the_delay_without_a_flush() {
        let sink = Sink::default();
        let (mut writer, _guard) = batched(sink.clone(), Duration::from_millis(5)).unwrap();
        writer.write_all(b"one\n").unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while sink.0.lock().unwrap().0.is_empty() {
            assert!(Instant::now() < deadline, "the line never reached the output");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(sink.0.lock().unwrap().0, b"one\n");
    }

    #[test]
    fn dropping_the_guard_writes_everything_pending() {
        let sink = Sink::default();
        // A delay far longer than the test: only the guard's drop can write the lines.
        let (mut writer, guard) = batched(sink.clone(), Duration::from_secs(3600)).unwrap();
        writer.write_all(b"a\n").unwrap();
        std::thread::sleep(Duration::from_millis(20)); // the thread is now in its delay
        writer.write_all(b"b\n").unwrap();
        let started = Instant::now();
        drop(guard);
        assert_eq!(sink.0.lock().unwrap().0, b"a\nb\n");
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "close waited out the delay"
        );
    }
}
