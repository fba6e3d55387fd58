//! Typed value access (`tensor_set_f32`, `tensor_get_i32`, ...) says exactly what is wrong:
//! another dtype, a non-contiguous tensor, or a count that is not the element count.

mod common;

use rgml::alloc::alloc_ctx_tensors;
use rgml::{Context, DType, Error};

#[test]
fn typed_access_errors_name_the_tensor_and_the_numbers() {
    let mut ctx = Context::new();
    let x = ctx.new_tensor(DType::F32, &[4, 4]).unwrap();
    ctx.set_name(x, "x").unwrap();
    let h = ctx.new_tensor(DType::F16, &[4]).unwrap();
    ctx.set_name(h, "h").unwrap();
    let xt = ctx.transpose(x).unwrap();
    alloc_ctx_tensors(&mut ctx, &common::vec_buffer_type("A", usize::MAX)).unwrap();
    let values: Vec<f32> = (0..16).map(|i| i as f32 * 0.25 - 1.0).collect();
    ctx.tensor_set_f32(x, &values).unwrap();
    assert_eq!(ctx.tensor_get_f32(x).unwrap(), values);

    let err = ctx.tensor_set_f32(x, &values[..10]).unwrap_err();
    assert!(
        matches!(&err, Error::ValueCount { tensor, n_elements: 16, given: 10 } if tensor == "x"),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        "tensor 'x' has 16 elements, 10 values given"
    );
    let err = ctx.tensor_set_f32(h, &values[..4]).unwrap_err();
    assert!(
        matches!(
            &err,
            Error::DTypeMismatch {
                dtype: DType::F16,
                asked: DType::F32,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(!err.to_string().contains("NONE"), "{err}");
    let err = ctx.tensor_get_f32(xt).unwrap_err();
    assert!(matches!(err, Error::NotContiguous(_)), "{err:?}");
}
