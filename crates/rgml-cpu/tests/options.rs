//! The CPU backend's configuration is typed: [`rgml_cpu::CpuOptions`] on the registry and its
//! devices, the backend parameter `isa=`; bad values are errors; a forced arithmetic reaches
//! the kernels (and runs on any CPU, whatever instructions it has).

use rgml::backend::BackendParams;
use rgml::{Backend, Context, DType, Device, Error, Graph};
use rgml_cpu::{CpuBackend, CpuDevice, CpuFeatures, CpuOptions, CpuRegistry, Isa, IsaChoice};

fn params(text: &str) -> BackendParams {
    BackendParams::parse(text).unwrap()
}

#[test]
fn bad_isa_parameters_are_errors_naming_the_value() {
    let dev = CpuDevice::new("CPU");
    for bad in ["bogus", "", "sse4"] {
        match dev.init_backend(&params(&format!("isa={bad}"))) {
            Err(Error::InvalidParams { params, reason }) => {
                assert_eq!(params, format!("isa={bad}"));
                assert!(reason.contains(&format!("'{bad}'")), "{reason}");
                assert!(reason.contains("avx512-nobf16"), "{reason}");
            }
            Err(e) => panic!("isa={bad}: {e}"),
            Ok(_) => panic!("isa={bad} was accepted"),
        }
    }
}

#[test]
fn the_isa_parameter_sets_the_backends_arithmetic() {
    let dev = CpuDevice::new("CPU");
    let detected = dev.features();
    assert_eq!(detected, CpuFeatures::detect());
    let open = |text: &str| -> CpuFeatures {
        let mut b = dev.init_backend(&params(text)).unwrap();
        let cpu = b.downcast_mut::<CpuBackend>().unwrap();
        cpu.features()
    };
    assert_eq!(open(""), detected);
    assert_eq!(open("isa=avx2").isa(), Isa::Avx2);
    let wide = open("isa=AVX512");
    assert_eq!(wide.isa(), Isa::Avx512);
    assert_eq!(wide.bf16_products(), detected.has_avx512_bf16());
    let nobf16 = open("isa=avx512-nobf16");
    assert_eq!((nobf16.isa(), nobf16.bf16_products()), (Isa::Avx512, false));
    // Never a hardware path the CPU lacks.
    for f in [wide, nobf16] {
        assert_eq!(f.has_avx512(), detected.has_avx512());
        assert_eq!(f.has_avx2(), detected.has_avx2());
    }

    // A device-wide choice, which the parameter overrides.
    let options = CpuOptions {
        isa: Some(IsaChoice::Avx512),
        ..Default::default()
    };
    let forced = CpuDevice::with_options("CPU", &options);
    assert_eq!(forced.features().isa(), Isa::Avx512);
    let backend = CpuBackend::with_device(forced.clone(), 1).unwrap();
    assert_eq!(backend.features(), forced.features());
    let mut b = forced.init_backend(&params("isa=avx2")).unwrap();
    let cpu = b.downcast_mut::<CpuBackend>().unwrap();
    assert_eq!(cpu.features().isa(), Isa::Avx2);
}

/// SOFT_MAX of a 16-wide row: the AVX2 build (groups of 8, `__m256` exp) and the AVX-512 build
/// (one group of 16, `__m512` exp, another horizontal sum) round differently on some rows; the
/// backends follow their own arithmetic, each the same whatever the device's default.
#[test]
fn forced_arithmetic_reaches_the_kernels() {
    let run = |backend: &mut dyn Backend| -> Vec<u32> {
        let mut ctx = Context::new();
        let x = ctx.new_tensor(DType::F32, &[16, 64]).unwrap();
        let y = ctx.soft_max(x).unwrap();
        let graph = Graph::build(&mut ctx, &[y]).unwrap();
        rgml::alloc::alloc_ctx_tensors(&mut ctx, &backend.default_buffer_type()).unwrap();
        let v: Vec<f32> = (0..16 * 64)
            .map(|i| ((i * 7919 % 1013) as f32 - 500.0) * 0.0371)
            .collect();
        ctx.tensor_set_f32(x, &v).unwrap();
        backend.graph_compute(&ctx, &graph).unwrap();
        ctx.tensor_get_f32(y)
            .unwrap()
            .iter()
            .map(|f| f.to_bits())
            .collect()
    };
    let dev = CpuDevice::new("CPU");
    let avx2 = run(dev.init_backend(&params("isa=avx2")).unwrap().as_mut());
    let avx512 = run(dev.init_backend(&params("isa=avx512")).unwrap().as_mut());
    assert_ne!(avx2, avx512, "the two builds' softmax rounds differently");
    for (choice, want) in [(IsaChoice::Avx2, &avx2), (IsaChoice::Avx512, &avx512)] {
        let options = CpuOptions {
            isa: Some(choice),
            ..Default::default()
        };
        let forced = CpuDevice::with_options("CPU", &options);
        let got = run(forced.init_backend(&params("")).unwrap().as_mut());
        assert_eq!(&got, want, "{choice}");
    }
}

#[test]
fn registry_options() {
    let names = |r: &CpuRegistry| -> Vec<String> {
        rgml::registry::Registry::devices(r)
            .iter()
            .map(|d| d.name().to_string())
            .collect()
    };
    let default = CpuRegistry::with_options(&CpuOptions::default()).unwrap();
    assert_eq!(names(&default), ["CPU"]);
    let three = CpuOptions {
        extra_devices: 3,
        ..Default::default()
    };
    assert_eq!(
        names(&CpuRegistry::with_options(&three).unwrap()),
        ["CPU", "CPU0", "CPU1", "CPU2"]
    );
    let many = CpuOptions {
        extra_devices: rgml_cpu::MAX_EXTRA_DEVICES + 1,
        ..Default::default()
    };
    assert!(matches!(
        CpuRegistry::with_options(&many),
        Err(Error::InvalidParams { .. })
    ));
    assert!(rgml_cpu::register_with(&many).is_err());

    // Repacking off: no extra buffer type, whatever the CPU.
    let plain = CpuOptions {
        repack: false,
        ..Default::default()
    };
    assert!(CpuDevice::with_options("CPU", &plain)
        .extra_buffer_types()
        .is_empty());
    // The AVX2 arithmetic has packed kernels of its own (generation's matrix-vector product,
    // prompts through its column kernel) where the CPU runs the AVX2 build: AVX2 without
    // AVX-512 (an AVX-512 CPU computes the AVX2 arithmetic in its AVX-512 tiles, unpacked).
    let avx2 = CpuOptions {
        isa: Some(IsaChoice::Avx2),
        ..Default::default()
    };
    let native = CpuDevice::new("CPU").features();
    assert_eq!(
        CpuDevice::with_options("CPU", &avx2)
            .extra_buffer_types()
            .len(),
        usize::from(native.has_avx2() && !native.has_avx512())
    );
}
