//! Misuse of the backend API through the CPU device returns errors, never panics.

use rgml::backend::Buffer;
use rgml::{Context, DType, Error};

fn cpu() -> rgml::DeviceRef {
    rgml_cpu::register();
    rgml::registry::device("CPU").expect("CPU device")
}

#[test]
fn out_of_bounds_set_and_get_are_errors() {
    let dev = cpu();
    let mut ctx = Context::new();
    let t = ctx.new_tensor(DType::F32, &[4, 2]).unwrap();
    // Before allocation there is no storage.
    assert!(matches!(
        ctx.tensor_set(t, 0, &[1, 2, 3, 4]),
        Err(Error::NoStorage(_))
    ));
    let buffer = Buffer::alloc(&dev.buffer_type(), 64).unwrap();
    ctx.set_data(t, buffer.clone(), 0).unwrap();
    let values: Vec<f32> = (0..8).map(|i| i as f32 * 0.5 - 1.25).collect();
    ctx.tensor_set_f32(t, &values).unwrap();
    assert_eq!(ctx.tensor_get_f32(t).unwrap(), values);

    // Past the tensor's 32 bytes, though still inside the buffer.
    assert!(matches!(
        ctx.tensor_set(t, 28, &[0; 8]),
        Err(Error::OutOfBounds { .. })
    ));
    let mut out = [0u8; 8];
    assert!(matches!(
        ctx.tensor_get(t, 30, &mut out),
        Err(Error::OutOfBounds { .. })
    ));
    assert!(matches!(
        ctx.tensor_get(t, usize::MAX, &mut out),
        Err(Error::OutOfBounds { .. })
    ));
    // Too few values: a count error (issue 14 asked for this one to be exact).
    assert!(matches!(
        ctx.tensor_set_f32(t, &values[..3]),
        Err(Error::ValueCount { given: 3, .. })
    ));
    // Past the buffer itself.
    assert!(matches!(
        buffer.set(60, &[0; 8]),
        Err(Error::OutOfBounds { .. })
    ));
    let mut big = vec![0u8; 65];
    assert!(matches!(
        buffer.get(0, &mut big),
        Err(Error::OutOfBounds { .. })
    ));
    // A tensor placed where it does not fit.
    let u = ctx.new_tensor(DType::F32, &[16]).unwrap();
    assert!(matches!(
        ctx.set_data(u, buffer.clone(), 32),
        Err(Error::OutOfBounds { .. })
    ));
    // Nothing was lost by the failed calls.
    assert_eq!(ctx.tensor_get_f32(t).unwrap(), values);
}

#[test]
fn unknown_device_names_are_errors() {
    cpu();
    let err = rgml::registry::init_backend("GPU7")
        .err()
        .expect("an error");
    assert!(matches!(err, Error::UnknownDevice { .. }), "{err}");
    assert!(
        err.to_string().contains("CPU"),
        "the message lists what exists: {err}"
    );
    assert!(rgml::registry::init_backend("CPU:n_threads=two").is_err());
    assert!(rgml::registry::init_backend("CPU:n_threads=2").is_ok());
}
