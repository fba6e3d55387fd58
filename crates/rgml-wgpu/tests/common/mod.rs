//! What the wgpu integration tests share: finding the first adapter.

use rgml::DeviceRef;

/// The first wgpu device, or `None` (after saying so) where there is no adapter. With
/// `RGML_REQUIRE_GPU=1` (set by `scripts/test.sh`, so CI never skips) no adapter is a failure.
pub fn first_device() -> Option<DeviceRef> {
    let reg = rgml_wgpu::WgpuRegistry::new();
    let dev = rgml::registry::Registry::devices(&reg).into_iter().next();
    if dev.is_none() {
        let required = std::env::var("RGML_REQUIRE_GPU").is_ok_and(|v| v == "1");
        assert!(!required, "RGML_REQUIRE_GPU=1 but there is no GPU adapter");
        eprintln!("no GPU adapter: skipping");
    }
    dev
}
