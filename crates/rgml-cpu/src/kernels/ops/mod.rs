//! Floor 5 of the kernels: every op but MUL_MAT, one module per op family. They use the floors
//! below (the task, conversions, vector math, pair dots) and never each other.

pub(crate) mod copy;
pub(crate) mod elementwise;
#[cfg(target_arch = "x86_64")]
pub(crate) mod flash_attn;
pub(crate) mod hadamard;
pub(crate) mod norm;
pub(crate) mod recurrent;
pub(crate) mod rope;
pub(crate) mod rows;
pub(crate) mod softmax;
pub(crate) mod sort;
