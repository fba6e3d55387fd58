//! The WGSL kernels: the parameter block every kernel reads, the kernel list, compiling them
//! into pipelines with one shared bind group layout, and the probe of the device's `fma`.
//!
//! The bottom of the crate's modules: it knows wgpu and the WGSL sources, nothing of devices,
//! buffers or graphs.

/// Invocations per workgroup (the kernels' `@workgroup_size`).
pub(crate) const WG: u64 = 64;
/// Bytes per node in the uniform buffer (a multiple of every adapter's uniform offset alignment).
pub(crate) const PARAM_STRIDE: u64 = 256;
/// Most workgroups in one dispatch dimension (the WebGPU default limit).
pub(crate) const MAX_GROUPS: u64 = 65535;

/// The uniform block every kernel reads (`struct P` in `kernels.wgsl`).
#[repr(C)]
#[derive(Clone, Copy, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub(crate) struct Params {
    pub(crate) a_ne: [u32; 4],
    pub(crate) a_nb: [u32; 4],
    pub(crate) b_ne: [u32; 4],
    pub(crate) b_nb: [u32; 4],
    pub(crate) c_ne: [u32; 4],
    pub(crate) c_nb: [u32; 4],
    pub(crate) d_ne: [u32; 4],
    pub(crate) d_nb: [u32; 4],
    pub(crate) off: [u32; 4],
    pub(crate) misc: [u32; 4],
    pub(crate) f: [f32; 4],
    pub(crate) g: [f32; 4],
}

/// The kernels: those of the exact arithmetic (`kernels.wgsl`, `kernels_f16.wgsl`,
/// `kernels_f64.wgsl`), compiled when the device opens, and the fast arithmetic's
/// (`kernels_fast.wgsl`), compiled on first use per weight type.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub(crate) enum Kernel {
    Binary,
    Scale,
    Clamp,
    AddId,
    Silu,
    Cpy,
    GetRows,
    RmsNorm,
    SoftMax,
    MulMat,
    CpyF16,
    Glu,
    Gelu,
    DiagMaskInf,
    Norm,
    Rope,
    SetRows,
    Concat,
    Argmax,
    SetRowsF16,
    QuantizeQ8,
    MulMatQ8,
    RmsNormF64,
    NormF64,
    SoftMaxF64,
    MulMvQ8,
    MulMv,
    RopeCache,
    RopeCacheF64,
    /// SILU and SWIGLU with glibc's `expf` on the rows' tails.
    SiluF64,
    /// A fast kernel for weights of the given type code (`T_*` in the WGSL; 0 where the kernel
    /// reads no weights).
    Fast(FastKernel, u32),
}

/// The kernels of `kernels_fast.wgsl`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub(crate) enum FastKernel {
    /// `mul_mv_fast`: MUL_MAT of up to [`MV_COLS`] activation columns.
    MulMv,
    /// `mul_mm_fast`: tiled MUL_MAT.
    MulMm,
    /// `mul_mv_id_fast`: MUL_MAT_ID, one activation column per workgroup.
    MulMvId,
    /// `sum_rows_fast`: SUM_ROWS, a workgroup per row.
    SumRows,
    /// `argsort_fast`: ARGSORT, a workgroup per row.
    Argsort,
    /// `rms_norm_fast`: RMS_NORM, a workgroup per row.
    RmsNorm,
    /// `soft_max_fast`: SOFT_MAX, a workgroup per row.
    SoftMax,
    /// `mul_mm_coop`: tiled MUL_MAT on cooperative matrices (only where [`Kernels::coop`]).
    MulMmCoop,
    /// `mul_mv_blocks` (`kernels_mv.wgsl`): MUL_MAT of `cols` activation columns (1 to
    /// [`MV_COLS`]), [`Kernels::mv_rows`] weight rows per workgroup, for the weight types it
    /// decodes (`ops::mv_blocks_alignment`); with `glu`, the gate and up projections of one
    /// activation and their SwiGLU; with `dp4a`, activations quantized by `quantize_q8_fast`
    /// and integer dots.
    MulMvBlocks { cols: u32, glu: bool, dp4a: bool },
    /// `quantize_q8_fast`: a DP4A mat-vec's activations as int8 blocks.
    QuantizeQ8,
    /// `to_f16_fast`: a prompt's activations as f16 for `mul_mm_coop`.
    ToF16,
    /// `flash_attn_fast`: FLASH_ATTN_EXT, a workgroup per query row and split of the keys.
    FlashAttn,
    /// `flash_attn_merge`: the splits of `flash_attn_fast` added.
    FlashAttnMerge,
    /// `ssm_conv_fast`: SSM_CONV, one invocation per output.
    SsmConv,
    /// `gated_delta_net_fast`: GATED_DELTA_NET, one invocation per state row.
    GatedDeltaNet,
    /// `unary_fast`: TANH, NEG, SIGMOID, EXP and SOFTPLUS, one invocation per element.
    Unary,
    /// `mm_id_lists`: MUL_MAT_ID's columns listed per expert, a workgroup per expert.
    MmIdLists,
    /// `mul_mm_id_fast`: MUL_MAT_ID of many columns, `mul_mm_fast`'s tiles per expert.
    MulMmId,
}

impl FastKernel {
    fn entry(self) -> &'static str {
        match self {
            FastKernel::MulMv => "mul_mv_fast",
            FastKernel::MulMm => "mul_mm_fast",
            FastKernel::MulMvId => "mul_mv_id_fast",
            FastKernel::SumRows => "sum_rows_fast",
            FastKernel::Argsort => "argsort_fast",
            FastKernel::RmsNorm => "rms_norm_fast",
            FastKernel::SoftMax => "soft_max_fast",
            FastKernel::MulMmCoop => "mul_mm_coop",
            FastKernel::MulMvBlocks { .. } => "mul_mv_blocks",
            FastKernel::QuantizeQ8 => "quantize_q8_fast",
            FastKernel::ToF16 => "to_f16_fast",
            FastKernel::FlashAttn => "flash_attn_fast",
            FastKernel::FlashAttnMerge => "flash_attn_merge",
            FastKernel::SsmConv => "ssm_conv_fast",
            FastKernel::GatedDeltaNet => "gated_delta_net_fast",
            FastKernel::Unary => "unary_fast",
            FastKernel::MmIdLists => "mm_id_lists",
            FastKernel::MulMmId => "mul_mm_id_fast",
        }
    }
}

/// The cooperative-matrix shape `mul_mm_coop` is compiled for: square fragments of `frag`
/// f16 elements with f32 sums, in subgroups of `subgroup` invocations. Its workgroup of 128
/// gives each subgroup 2 x 2 fragments of the 64 x 64 tile, so the two go together: 16 x 16
/// fragments with subgroups of 32 (NVIDIA), 8 x 8 with subgroups of 8 (lavapipe).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct CoopShape {
    pub(crate) frag: u32,
    pub(crate) subgroup: u32,
}

/// The shape `mul_mm_coop` can run in on `adapter`, if any: wgpu's
/// `EXPERIMENTAL_COOPERATIVE_MATRIX` and `SHADER_F16`, one subgroup size, and an f16 x f16 + f32
/// configuration of a matching fragment.
pub(crate) fn coop_shape(adapter: &wgpu::Adapter) -> Option<CoopShape> {
    let needed = wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX | wgpu::Features::SHADER_F16;
    if !adapter.features().contains(needed) {
        return None;
    }
    let info = adapter.get_info();
    if info.subgroup_min_size != info.subgroup_max_size {
        return None;
    }
    let offered = adapter.cooperative_matrix_properties();
    [(16, 32), (8, 8)]
        .into_iter()
        .map(|(frag, subgroup)| CoopShape { frag, subgroup })
        .find(|shape| {
            shape.subgroup == info.subgroup_min_size
                && offered.iter().any(|m| {
                    m.m_size == shape.frag
                        && m.n_size == shape.frag
                        && m.k_size == shape.frag
                        && m.ab_type == wgpu::CooperativeScalarType::F16
                        && m.cr_type == wgpu::CooperativeScalarType::F32
                })
        })
}

/// What a device asks for to compile `mul_mm_coop`: the token for wgpu's experimental features.
pub(crate) fn coop_experimental_features() -> wgpu::ExperimentalFeatures {
    // SAFETY: the one experimental feature asked for with it is EXPERIMENTAL_COOPERATIVE_MATRIX,
    // used only by `mul_mm_coop`, whose loads and stores address workgroup arrays within
    // bounds (64-wide tiles, fragment offsets below 64 - 2 * frag, strides of 64); its other
    // memory accesses are plain WGSL, bounds-checked by wgpu.
    unsafe { wgpu::ExperimentalFeatures::enabled() }
}

/// The source of the cooperative-matrix module for `shape`: the fast kernels' source with the
/// bindings `A`, `B`, `C` renamed (WGSL's matrix roles are spelled `A`, `B`, `C`), then
/// `kernels_coop.wgsl` with its fragment type, edge and subgroup size filled in.
fn coop_source(shape: CoopShape, subgroup_rows: bool) -> String {
    let fast = fast_source(subgroup_rows);
    let (frag, subgroup) = (shape.frag, shape.subgroup);
    format!(
        "enable f16;\nenable wgpu_cooperative_matrix;\nconst FRAG: u32 = {frag}u;\n\
         const SUBGROUP: u32 = {subgroup}u;\n{}\n{}",
        rename_bindings(&fast),
        include_str!("kernels_coop.wgsl").replace("COOP_MAT", &format!("coop_mat{frag}x{frag}"))
    )
}

/// The fast kernels' source: `params.wgsl`, `common.wgsl`, `convert.wgsl`, how `mul_mv_fast`
/// adds a row's 32 partial sums, and `kernels_fast.wgsl`. With `subgroup_rows` (subgroups of exactly 32 invocations, which
/// `mul_mv_fast`'s rows then are) a subgroup sum (naga takes subgroup operations without an
/// `enable`, on devices opened with `SUBGROUP`); else a tree through workgroup memory.
fn fast_source(subgroup_rows: bool) -> String {
    format!(
        "{}\n{}{}",
        concat!(
            include_str!("params.wgsl"),
            include_str!("common.wgsl"),
            include_str!("convert.wgsl")
        ),
        row_total_source(subgroup_rows),
        include_str!("kernels_fast.wgsl")
    )
}

/// `SUBGROUP_ROWS` and `row_total`: a subgroup's sum with `subgroup_rows`, else the value.
fn row_total_source(subgroup_rows: bool) -> &'static str {
    if subgroup_rows {
        "const SUBGROUP_ROWS: bool = true;\nfn row_total(v: f32) -> f32 { return subgroupAdd(v); }\n"
    } else {
        "const SUBGROUP_ROWS: bool = false;\nfn row_total(v: f32) -> f32 { return v; }\n"
    }
}

/// The block mat-vec's source: `params.wgsl`, `convert.wgsl`, the row sums as [`fast_source`]
/// has them, and `kernels_mv.wgsl` (which binds A, B and D its own way).
fn mv_source(subgroup_rows: bool) -> String {
    format!(
        "{}\n{}{}",
        concat!(include_str!("params.wgsl"), include_str!("convert.wgsl")),
        row_total_source(subgroup_rows),
        include_str!("kernels_mv.wgsl")
    )
}

/// Whether `mul_mv_fast` sums its rows with subgroup operations on `adapter`: wgpu's `SUBGROUP`
/// and subgroups of exactly 32 invocations (a row's invocations are then one subgroup).
pub(crate) fn subgroup_rows(adapter: &wgpu::Adapter) -> bool {
    let info = adapter.get_info();
    adapter.features().contains(wgpu::Features::SUBGROUP)
        && info.subgroup_min_size == 32
        && info.subgroup_max_size == 32
}

/// `source` with every identifier `A`, `B` or `C` (the storage bindings) renamed `AB`, `BB`,
/// `CB`.
fn rename_bindings(source: &str) -> String {
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let chars: Vec<char> = source.chars().collect();
    let mut out = String::with_capacity(source.len() + 256);
    for (i, &c) in chars.iter().enumerate() {
        out.push(c);
        let alone = matches!(c, 'A' | 'B' | 'C')
            && (i == 0 || !ident(chars[i - 1]))
            && chars.get(i + 1).is_none_or(|&n| !ident(n));
        if alone {
            out.push('B');
        }
    }
    out
}

/// Most activation columns `mul_mv_fast` takes (`MV_COLS` in the WGSL); more take `mul_mm_fast`.
pub(crate) const MV_COLS: usize = 8;
/// Weight rows per workgroup of `mul_mv_fast`.
pub(crate) const MV_ROWS: u64 = 2;
/// Invocations per workgroup of `mul_mv_blocks` (`MV_WG` in the WGSL).
const MV_BLOCKS_WG: u32 = 128;
/// Most weight rows per team of `mul_mv_blocks` (`MV_MAX_ROWS` in the WGSL).
pub(crate) const MV_BLOCKS_MAX_ROWS: u32 = 4;
/// Outputs per tile edge of `mul_mm_fast` (`TILE` in the WGSL).
pub(crate) const MM_TILE: u64 = 64;

/// The WGSL module a kernel is in.
#[derive(Clone, Copy, PartialEq)]
enum Module {
    /// `kernels.wgsl`: f32 / i32 results.
    Plain,
    /// `kernels_f16.wgsl`: f16 results.
    F16,
    /// `kernels_f64.wgsl`: f64 sums, only where the adapter offers `SHADER_F64`.
    F64,
}

/// Each kernel's entry point and module.
const KERNELS: [(Kernel, &str, Module); 30] = [
    (Kernel::Binary, "binary", Module::Plain),
    (Kernel::Scale, "scale", Module::Plain),
    (Kernel::Clamp, "clamp_op", Module::Plain),
    (Kernel::AddId, "add_id", Module::Plain),
    (Kernel::Silu, "silu", Module::Plain),
    (Kernel::Cpy, "cpy", Module::Plain),
    (Kernel::GetRows, "get_rows", Module::Plain),
    (Kernel::RmsNorm, "rms_norm", Module::Plain),
    (Kernel::SoftMax, "soft_max", Module::Plain),
    (Kernel::MulMat, "mul_mat", Module::Plain),
    (Kernel::CpyF16, "cpy_f16", Module::F16),
    (Kernel::Glu, "glu", Module::Plain),
    (Kernel::Gelu, "gelu", Module::Plain),
    (Kernel::DiagMaskInf, "diag_mask_inf", Module::Plain),
    (Kernel::Norm, "norm", Module::Plain),
    (Kernel::Rope, "rope", Module::Plain),
    (Kernel::SetRows, "set_rows", Module::Plain),
    (Kernel::Concat, "concat", Module::Plain),
    (Kernel::Argmax, "argmax", Module::Plain),
    (Kernel::SetRowsF16, "set_rows_f16", Module::F16),
    (Kernel::QuantizeQ8, "quantize_q8", Module::Plain),
    (Kernel::MulMatQ8, "mul_mat_q8", Module::Plain),
    (Kernel::RmsNormF64, "rms_norm_f64", Module::F64),
    (Kernel::NormF64, "norm_f64", Module::F64),
    (Kernel::SoftMaxF64, "soft_max_f64", Module::F64),
    (Kernel::MulMvQ8, "mul_mv_q8", Module::Plain),
    (Kernel::MulMv, "mul_mv", Module::Plain),
    (Kernel::RopeCache, "rope_cache", Module::Plain),
    (Kernel::RopeCacheF64, "rope_cache_f64", Module::F64),
    (Kernel::SiluF64, "silu_f64", Module::F64),
];

/// The compiled kernels and their shared bind group layout.
pub(crate) struct Kernels {
    pub(crate) layout: wgpu::BindGroupLayout,
    /// The exact kernels, in `KERNELS`' order; `None` for the f64 kernels where the device has
    /// no f64.
    pipelines: Vec<Option<wgpu::ComputePipeline>>,
    /// The f64 kernels exist.
    pub(crate) f64: bool,
    /// What compiling a fast kernel needs: the device, the pipeline layout, and the module,
    /// made on the first fast kernel (a stream in exact arithmetic never pays for it).
    device: wgpu::Device,
    pipeline_layout: wgpu::PipelineLayout,
    hw_fma: bool,
    fast_module: std::sync::OnceLock<wgpu::ShaderModule>,
    /// The cooperative-matrix shape `mul_mm_coop` runs in, where the device was opened with it.
    pub(crate) coop: Option<CoopShape>,
    /// `mul_mv_fast` sums rows with subgroup operations (see [`subgroup_rows`]).
    subgroup_rows: bool,
    coop_module: std::sync::OnceLock<wgpu::ShaderModule>,
    /// Weight rows per workgroup of `mul_mv_blocks` (1 to [`MV_BLOCKS_MAX_ROWS`]); 0: it is
    /// not used (`mul_mv_fast` takes every mat-vec).
    pub(crate) mv_rows: u32,
    /// Invocations per team of `mul_mv_blocks` (32 or 128: see `kernels_mv.wgsl`).
    mv_team: u32,
    /// `mul_mv_blocks` takes Q4_0, Q8_0, Q4_K and Q6_K weights with int8 activations and DP4A.
    pub(crate) mv_dp4a: bool,
    mv_module: std::sync::OnceLock<wgpu::ShaderModule>,
    /// The fast kernels compiled so far, by kernel and weight type.
    fast: std::sync::Mutex<std::collections::HashMap<(FastKernel, u32), wgpu::ComputePipeline>>,
}

impl Kernels {
    /// Compile every kernel (errors surface through the device's error slot); `hw_fma`: the
    /// device's `fma` rounds once (see [`probe_fused_fma`]); `coop`: the device was opened
    /// for `mul_mm_coop` in this shape.
    pub(crate) fn new(
        device: &wgpu::Device,
        hw_fma: bool,
        coop: Option<CoopShape>,
        subgroup_rows: bool,
        mv_rows: u32,
        mv_team: u32,
        mv_dp4a: bool,
    ) -> Kernels {
        let f64 = device.features().contains(wgpu::Features::SHADER_F64);
        let storage = |binding| wgpu::BindGroupLayoutEntry {
            binding,
            visibility: wgpu::ShaderStages::COMPUTE,
            ty: wgpu::BindingType::Buffer {
                ty: wgpu::BufferBindingType::Storage { read_only: false },
                has_dynamic_offset: false,
                min_binding_size: None,
            },
            count: None,
        };
        let layout = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
            label: Some("rgml kernels"),
            entries: &[
                wgpu::BindGroupLayoutEntry {
                    binding: 0,
                    visibility: wgpu::ShaderStages::COMPUTE,
                    ty: wgpu::BindingType::Buffer {
                        ty: wgpu::BufferBindingType::Uniform,
                        has_dynamic_offset: false,
                        min_binding_size: None,
                    },
                    count: None,
                },
                storage(1),
                storage(2),
                storage(3),
                storage(4),
            ],
        });
        let pipeline_layout = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
            label: Some("rgml kernels"),
            bind_group_layouts: &[Some(&layout)],
            immediate_size: 0,
        });
        let common = concat!(include_str!("params.wgsl"), include_str!("common.wgsl"));
        let module = |label, body: &str| shader_module(device, label, format!("{common}\n{body}"));
        let plain = module("rgml kernels", include_str!("kernels.wgsl"));
        let f16 = module("rgml f16 kernels", include_str!("kernels_f16.wgsl"));
        let wide = f64.then(|| module("rgml f64 kernels", include_str!("kernels_f64.wgsl")));
        let pipelines = KERNELS
            .iter()
            .map(|(_, entry, m)| {
                let module = match m {
                    Module::Plain => &plain,
                    Module::F16 => &f16,
                    Module::F64 => wide.as_ref()?,
                };
                Some(
                    device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                        label: Some(entry),
                        layout: Some(&pipeline_layout),
                        module,
                        entry_point: Some(entry),
                        compilation_options: wgpu::PipelineCompilationOptions {
                            constants: &[("HW_FMA", if hw_fma { 1.0 } else { 0.0 })],
                            ..Default::default()
                        },
                        cache: None,
                    }),
                )
            })
            .collect();
        Kernels {
            layout,
            pipelines,
            f64,
            device: device.clone(),
            pipeline_layout,
            hw_fma,
            fast_module: std::sync::OnceLock::new(),
            coop,
            subgroup_rows,
            coop_module: std::sync::OnceLock::new(),
            mv_rows: mv_rows.min(MV_BLOCKS_MAX_ROWS),
            mv_team: if mv_team == 32 { 32 } else { 128 },
            mv_dp4a,
            mv_module: std::sync::OnceLock::new(),
            fast: Default::default(),
        }
    }

    /// Weight rows per workgroup of `mul_mv_blocks`: [`Kernels::mv_rows`] per team; 0 where
    /// it is not used.
    pub(crate) fn mv_group_rows(&self) -> u64 {
        u64::from(self.mv_rows * (MV_BLOCKS_WG / self.mv_team))
    }

    /// The kernel's pipeline (`None` only for f64 kernels on a device without f64, which
    /// the node preparation never picks). A fast kernel is compiled on its first use; errors
    /// surface through the device's error slot, as at opening.
    pub(crate) fn pipeline(&self, kernel: Kernel) -> Option<wgpu::ComputePipeline> {
        if let Kernel::Fast(fast, type_code) = kernel {
            return Some(self.fast_pipeline(fast, type_code));
        }
        let index = KERNELS.iter().position(|(k, _, _)| *k == kernel)?;
        self.pipelines.get(index)?.clone()
    }

    fn fast_pipeline(&self, kernel: FastKernel, type_code: u32) -> wgpu::ComputePipeline {
        let mut compiled = self.fast.lock().unwrap_or_else(|p| p.into_inner());
        compiled
            .entry((kernel, type_code))
            .or_insert_with(|| {
                let make = |label, source: String| shader_module(&self.device, label, source);
                let rows = self.subgroup_rows;
                let module = match (kernel, self.coop) {
                    (FastKernel::MulMmCoop, Some(shape)) => self
                        .coop_module
                        .get_or_init(|| make("rgml coop kernels", coop_source(shape, rows))),
                    (FastKernel::MulMvBlocks { .. }, _) => self
                        .mv_module
                        .get_or_init(|| make("rgml mat-vec kernels", mv_source(rows))),
                    _ => self
                        .fast_module
                        .get_or_init(|| make("rgml fast kernels", fast_source(rows))),
                };
                let type_code = f64::from(type_code);
                let fma = if self.hw_fma { 1.0 } else { 0.0 };
                let constants: &[(&str, f64)] = match kernel {
                    FastKernel::MulMvBlocks { cols, glu, dp4a } => &[
                        ("TYPE", type_code),
                        ("NCOLS", f64::from(cols)),
                        ("ROWS", f64::from(self.mv_rows.max(1))),
                        ("TEAM", f64::from(self.mv_team)),
                        ("GLU", if glu { 1.0 } else { 0.0 }),
                        ("DP4A", if dp4a { 1.0 } else { 0.0 }),
                    ],
                    _ => &[("HW_FMA", fma), ("TYPE", type_code)],
                };
                self.device
                    .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                        label: Some(kernel.entry()),
                        layout: Some(&self.pipeline_layout),
                        module,
                        entry_point: Some(kernel.entry()),
                        compilation_options: wgpu::PipelineCompilationOptions {
                            constants,
                            ..Default::default()
                        },
                        cache: None,
                    })
            })
            .clone()
    }
}

/// A WGSL module of rgml's kernels, with wgpu's bounds checks but without its loop counters:
/// wgpu bounds every loop with a 64-bit counter by default (a shader that never ends is
/// undefined behaviour for some drivers), which costs instructions in every loop and keeps
/// drivers from unrolling the short fixed loops the kernels index registers with.
fn shader_module(device: &wgpu::Device, label: &str, source: String) -> wgpu::ShaderModule {
    let mut checks = wgpu::ShaderRuntimeChecks::checked();
    checks.force_loop_bounding = false;
    let desc = wgpu::ShaderModuleDescriptor {
        label: Some(label),
        source: wgpu::ShaderSource::Wgsl(source.into()),
    };
    // SAFETY: only the loop bounding is off, and every loop of rgml's WGSL kernels is a `for`
    // over an integer that moves by a positive step towards a bound read from the uniform
    // block or a constant (no `loop` or `while`), so each ends; indexing stays bounds-checked.
    unsafe { device.create_shader_module_trusted(desc, checks) }
}

/// Whether the device's WGSL `fma` rounds once, as IEEE's fused multiply-add does (WGSL leaves
/// it to the implementation: lavapipe, for one, rounds the product first). Computes
/// `(1 + 2^-23)(1 - 2^-23) - 1` from a buffer, so no compiler can fold it: fused, that is
/// `-2^-46`; rounded twice, 0. Any failure answers no (the integer path is exact everywhere,
/// only slower). Not called with `WgpuOptions::soft_fma` (see the `gpu` module), which takes the integer path
/// on any device (for testing it).
pub(crate) fn probe_fused_fma(device: &wgpu::Device, queue: &wgpu::Queue) -> bool {
    use wgpu::util::DeviceExt;
    let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
        label: Some("rgml fma probe"),
        source: wgpu::ShaderSource::Wgsl(
            "@group(0) @binding(0) var<storage, read_write> v: array<f32>;\n\
             @compute @workgroup_size(1) fn main() { v[3] = fma(v[0], v[1], v[2]); }"
                .into(),
        ),
    });
    let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
        label: Some("rgml fma probe"),
        layout: None,
        module: &module,
        entry_point: Some("main"),
        compilation_options: Default::default(),
        cache: None,
    });
    let input = [1.0 + f32::EPSILON, 1.0 - f32::EPSILON, -1.0, 0.0];
    let data = device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
        label: Some("rgml fma probe"),
        contents: bytemuck::cast_slice(&input),
        usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC,
    });
    let read = device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("rgml fma probe read-back"),
        size: 16,
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let bind = device.create_bind_group(&wgpu::BindGroupDescriptor {
        label: None,
        layout: &pipeline.get_bind_group_layout(0),
        entries: &[wgpu::BindGroupEntry {
            binding: 0,
            resource: data.as_entire_binding(),
        }],
    });
    let mut encoder = device.create_command_encoder(&Default::default());
    {
        let mut pass = encoder.begin_compute_pass(&Default::default());
        pass.set_pipeline(&pipeline);
        pass.set_bind_group(0, &bind, &[]);
        pass.dispatch_workgroups(1, 1, 1);
    }
    encoder.copy_buffer_to_buffer(&data, 0, &read, 0, 16);
    queue.submit([encoder.finish()]);
    let (tx, rx) = std::sync::mpsc::channel();
    read.map_async(wgpu::MapMode::Read, .., move |r| {
        let _ = tx.send(r);
    });
    if device.poll(wgpu::PollType::wait_indefinitely()).is_err() {
        return false;
    }
    if !matches!(rx.recv(), Ok(Ok(()))) {
        return false;
    }
    let fused = match read.get_mapped_range(..) {
        Ok(view) => {
            let out: &[f32] = bytemuck::cast_slice(&view);
            out[3] != 0.0
        }
        Err(_) => false,
    };
    read.unmap();
    fused
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_binding_names_are_renamed() {
        let src = "fn af(i: u32) -> f32 { return bitcast<f32>(A[i]) + C[i] + B[T_B + AB]; } // A.";
        assert_eq!(
            rename_bindings(src),
            "fn af(i: u32) -> f32 { return bitcast<f32>(AB[i]) + CB[i] + BB[T_B + AB]; } // AB."
        );
    }

    /// `source` parses and validates as WGSL (with every capability: the device's features
    /// decide which modules are made, not this check).
    fn validate(source: &str, what: &str) -> wgpu::naga::Module {
        use wgpu::naga;
        let module = naga::front::wgsl::parse_str(source)
            .unwrap_or_else(|e| panic!("{what}: {}", e.emit_to_string(source)));
        naga::valid::Validator::new(
            naga::valid::ValidationFlags::all(),
            naga::valid::Capabilities::all(),
        )
        .validate(&module)
        .unwrap_or_else(|e| panic!("{what}: {}", e.emit_to_string(source)));
        module
    }

    /// The fast and mat-vec modules parse and validate with both row sums (CI's lavapipe has
    /// subgroups of 8, so it never compiles the subgroup ones).
    #[test]
    fn the_fast_modules_are_valid_wgsl_with_both_row_sums() {
        for rows in [false, true] {
            for source in [fast_source(rows), mv_source(rows)] {
                validate(&source, &format!("subgroup rows {rows}"));
                assert_eq!(source.contains("subgroupAdd"), rows);
            }
        }
    }

    /// The cooperative-matrix module parses and validates in both shapes (no adapter needed:
    /// CI's lavapipe offers no cooperative matrices, so this is what checks its source there).
    #[test]
    fn the_coop_module_is_valid_wgsl_in_both_shapes() {
        for shape in [
            CoopShape {
                frag: 16,
                subgroup: 32,
            },
            CoopShape {
                frag: 8,
                subgroup: 8,
            },
        ] {
            let source = coop_source(shape, shape.subgroup == 32);
            let module = validate(&source, &format!("{shape:?}"));
            let frag = shape.frag;
            assert!(source.contains(&format!("coop_mat{frag}x{frag}<f16, A>")));
            assert!(module.entry_points.iter().any(|e| e.name == "mul_mm_coop"));
        }
    }
}
