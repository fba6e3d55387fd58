//! Memory is compared with the device's free memory before it is taken: a buffer, or a graph's
//! compute buffer, larger than what the device reports free is refused with
//! `Error::InsufficientMemory` naming the sizes, and nothing is allocated.

use rgml::alloc::GraphAllocator;
use rgml::backend::DeviceMemory;
use rgml::testing::TestDevice;
use rgml::{Buffer, Context, DType, Device, Error, Graph};

fn small_device() -> std::sync::Arc<TestDevice> {
    TestDevice::builder("Small")
        .memory(DeviceMemory {
            free: 4096,
            total: 8192,
        })
        .build()
}

#[test]
fn a_buffer_beyond_free_memory_is_refused() {
    let device = small_device();
    let buft = device.buffer_type();
    let ok = Buffer::alloc(&buft, 4096).expect("fits");
    assert_eq!(ok.size(), 4096);
    match Buffer::alloc(&buft, 4097) {
        Err(Error::InsufficientMemory {
            device, size, free, ..
        }) => {
            assert_eq!((device.as_str(), size, free), ("Small", 4097, 4096));
        }
        other => panic!("expected InsufficientMemory, got {other:?}"),
    }
    // A device that does not know its memory (total 0) is not second-guessed.
    let unknown = TestDevice::builder("Unknown").build();
    assert!(Buffer::alloc(&unknown.buffer_type(), 1 << 20).is_ok());
}

#[test]
fn a_compute_buffer_beyond_free_memory_is_refused() {
    let device = small_device();
    let mut ctx = Context::new();
    let a = ctx.new_tensor(DType::F32, &[1024, 2]).unwrap();
    ctx.set_input(a).unwrap();
    let b = ctx.scale(a, 2.0).unwrap();
    let c = ctx.add(b, a).unwrap();
    let graph = Graph::build(&mut ctx, &[c]).unwrap();
    let mut alloc = GraphAllocator::new(vec![device.buffer_type()]);
    let err = alloc.reserve(&ctx, &graph).unwrap_err();
    assert!(
        matches!(err, Error::InsufficientMemory { size, free: 4096, .. } if size > 4096),
        "{err}"
    );
    assert!(err.to_string().contains("Small"), "{err}");
}
