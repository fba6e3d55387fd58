//! Test support shared by the CLI's integration tests.

use std::process::Command;

/// The name of the GPU device `rgml devices` lists (`Vulkan0`, `Metal0`, ...), if any. Without
/// one the GPU tests skip, unless `RGML_REQUIRE_GPU=1` (set by `scripts/test.sh`, so CI never
/// skips).
pub fn gpu_device() -> Option<String> {
    let out = Command::new(env!("CARGO_BIN_EXE_rgml"))
        .arg("devices")
        .output()
        .expect("run rgml devices");
    assert!(out.status.success(), "rgml devices failed");
    let name = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(|w| w.trim_end_matches(':'))
        .find(|w| ["Vulkan0", "Metal0", "DX120"].contains(w))
        .map(str::to_string);
    if name.is_none() {
        let required = std::env::var("RGML_REQUIRE_GPU").is_ok_and(|v| v == "1");
        assert!(
            !required,
            "RGML_REQUIRE_GPU=1 but `rgml devices` lists no GPU"
        );
        eprintln!("no GPU device: skipping");
    }
    name
}
