//! The host guards of a buffer: shared access (`host_read`, what graph compute takes for
//! weights it only reads) admits other readers but no writer; exclusive access (`host_write`,
//! for buffers a graph writes) admits nobody else.

use rgml::backend::Buffer;
use rgml::Device;
use rgml_cpu::CpuDevice;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Arc;
use std::time::Duration;

/// Long enough for an unblocked call on a loaded machine; a call that is (correctly) blocked
/// is only checked not to have finished within `BLOCKED`.
const UNBLOCKED: Duration = Duration::from_secs(120);
const BLOCKED: Duration = Duration::from_millis(200);

fn host_buffer() -> Arc<Buffer> {
    let dev = CpuDevice::new("CPU");
    let buffer = Buffer::alloc(&dev.buffer_type(), 4096).unwrap();
    buffer.set(0, &[7u8; 4096]).unwrap();
    buffer
}

/// Run `f` on another thread; the receiver gets its result.
fn spawn<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> mpsc::Receiver<T> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx
}

#[test]
fn shared_access_admits_readers_and_excludes_writers() {
    let buffer = host_buffer();
    let held = buffer.host_read().expect("host memory");
    assert!(!held.is_exclusive());

    let b = buffer.clone();
    let reader = spawn(move || b.host_read().map(|g| g.size()));
    assert_eq!(reader.recv_timeout(UNBLOCKED), Ok(Some(4096)));
    let b = buffer.clone();
    let get = spawn(move || {
        let mut out = [0u8; 16];
        b.get(100, &mut out).map(|()| out)
    });
    assert!(matches!(get.recv_timeout(UNBLOCKED), Ok(Ok(out)) if out == [7u8; 16]));

    let b = buffer.clone();
    let writer = spawn(move || b.set(0, &[1u8; 16]).is_ok());
    assert_eq!(
        writer.recv_timeout(BLOCKED),
        Err(RecvTimeoutError::Timeout),
        "a write went through while a computation held the buffer shared"
    );
    drop(held);
    assert_eq!(writer.recv_timeout(UNBLOCKED), Ok(true));
}

#[test]
fn exclusive_access_admits_nobody_else() {
    let buffer = host_buffer();
    let held = buffer.host_write().expect("host memory");
    assert!(held.is_exclusive());

    let b = buffer.clone();
    let reader = spawn(move || {
        let mut out = [0u8; 16];
        b.get(0, &mut out).map(|()| out)
    });
    let b = buffer.clone();
    let shared = spawn(move || b.host_read().is_some());
    assert_eq!(
        reader.recv_timeout(BLOCKED).map(|_| ()),
        Err(RecvTimeoutError::Timeout),
        "a read went through while a computation held the buffer exclusively"
    );
    assert_eq!(
        shared.recv_timeout(BLOCKED),
        Err(RecvTimeoutError::Timeout),
        "shared access was granted beside exclusive access"
    );
    drop(held);
    assert!(matches!(reader.recv_timeout(UNBLOCKED), Ok(Ok(out)) if out == [7u8; 16]));
    assert_eq!(shared.recv_timeout(UNBLOCKED), Ok(true));
}
