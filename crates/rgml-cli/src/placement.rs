//! Where a model command puts the model: the device flags (`--device`, `--split-mode`,
//! `--tensor-split`, `--tensor-sync`, `--rpc`, `-ngl`) turned into an [`rgml_llm::Placement`],
//! and the tensor overrides (`-ot`, `--cpu-moe`, `--n-cpu-moe`) into
//! [`rgml_llm::TensorOverride`]s.
//!
//! This module owns the choice of devices, the default GPU included, and the checks of those
//! flags together (a combination that makes no sense is a usage error naming the flags);
//! loading the weights where it says is `rgml-llm`'s.
//!
//! - No `--device`, no `--rpc`: the first GPU ([`first_gpu`]) takes every layer, as llama.cpp's
//!   default `-ngl` does; without one, the CPU. `-ngl N` offloads N layers there instead.
//! - `--device LIST` without `-ngl`: the list, split as `--split-mode` says.
//! - `--device LIST -ngl N`: N layers on the list's first non-CPU device (a CPU driver such as
//!   lavapipe included: named, it is used), the rest on the list's CPU device.
//! - `--rpc` without `--device`: every remote device, by layers; with `-ngl N`, N layers on the
//!   first GPU (the remote devices are GPUs, as ggml's client types them).

use crate::error::CliError;
use crate::gpu_layers::GpuLayers;
use crate::model_cmds::ModelArgs;
use rgml::backend::DeviceType;
use rgml::DeviceRef;
use rgml_llm::{Placement, TensorSync};

/// The first registered device that is a GPU (discrete or integrated; remote devices count,
/// as ggml types them GPUs) and not a CPU driver such as lavapipe: where the model goes by
/// default and with `-ngl`. A CPU driver is only used when `--device` names it.
pub fn first_gpu() -> Option<DeviceRef> {
    rgml::registry::devices().into_iter().find(|d| {
        matches!(d.device_type(), DeviceType::Gpu | DeviceType::IntegratedGpu) && !is_software(d)
    })
}

/// Whether `device` is a GPU device of a CPU driver (lavapipe, SwiftShader).
fn is_software(device: &DeviceRef) -> bool {
    device
        .downcast_ref::<rgml_wgpu::WgpuDevice>()
        .is_some_and(|d| d.is_software())
}

/// The comma-separated names of `list`, trimmed, empty ones left out.
fn split_names(list: &str) -> Vec<&str> {
    list.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect()
}

/// The registry's devices of `names`; an unknown one is a usage error naming `--device`.
fn named_devices(names: &[&str]) -> Result<Vec<DeviceRef>, CliError> {
    names
        .iter()
        .map(|n| rgml::registry::device(n).map_err(|e| CliError::usage(format!("--device: {e}"))))
        .collect()
}

/// One override: `pattern` compiled, `device` found in the registry; `flag` names the flag in
/// errors.
fn tensor_override(
    pattern: &str,
    device: &str,
    flag: &str,
) -> Result<rgml_llm::TensorOverride, CliError> {
    let pattern = regex::Regex::new(pattern)
        .map_err(|e| CliError::usage(format!("{flag}: pattern {pattern:?}: {e}")))?;
    let device =
        rgml::registry::device(device).map_err(|e| CliError::usage(format!("{flag}: {e}")))?;
    Ok(rgml_llm::TensorOverride { pattern, device })
}

fn host_cpu() -> Result<DeviceRef, CliError> {
    Ok(rgml::registry::device("CPU")?)
}

/// llama.cpp's pattern of the experts (`--cpu-moe`), after a block's `blk.N`.
const EXPERTS: &str = r"\.ffn_(up|down|gate|gate_up)_(ch|)exps";

impl ModelArgs {
    /// The tensor overrides of `-ot`, then `--cpu-moe` / `--n-cpu-moe` (the CPU device), in
    /// that order (the first match wins, as in llama.cpp).
    pub(crate) fn tensor_overrides(&self) -> Result<Vec<rgml_llm::TensorOverride>, CliError> {
        let mut out = Vec::new();
        for list in &self.override_tensor {
            for item in split_names(list) {
                let (pattern, device) = item.rsplit_once('=').ok_or_else(|| {
                    CliError::usage(format!(
                        "--override-tensor {item:?}: expected PATTERN=DEVICE"
                    ))
                })?;
                out.push(tensor_override(
                    pattern,
                    device.trim(),
                    "--override-tensor",
                )?);
            }
        }
        if self.cpu_moe && self.n_cpu_moe.is_some() {
            return Err(CliError::usage(
                "--cpu-moe and --n-cpu-moe exclude each other",
            ));
        }
        if self.cpu_moe {
            out.push(tensor_override(EXPERTS, "CPU", "--cpu-moe")?);
        }
        for il in 0..self.n_cpu_moe.unwrap_or(0) {
            let pattern = format!(r"blk\.{il}{EXPERTS}");
            out.push(tensor_override(&pattern, "CPU", "--n-cpu-moe")?);
        }
        Ok(out)
    }

    /// Where the model goes, from the device flags (see the module docs).
    pub(crate) fn placement(&self) -> Result<Placement, CliError> {
        let ngl = self.n_gpu_layers.and_then(GpuLayers::count);
        if ngl.is_some() {
            self.check_offload_flags()?;
        }
        match (&self.device, ngl) {
            (Some(list), Some(n)) => self.offload_in_list(list, n),
            (None, Some(n)) => self.offload_to_first_gpu(n),
            (None, None) if self.default_is_offload() => self.offload_to_first_gpu(usize::MAX),
            _ => self.list_placement(),
        }
    }

    /// Whether the command may put the model on a GPU that is not registered before the GPU
    /// backend is (CPU and remote devices are): then the GPU driver must be started.
    pub(crate) fn may_use_local_gpu(&self) -> bool {
        let ngl = self.n_gpu_layers.and_then(GpuLayers::count);
        match &self.device {
            Some(list) => crate::names_unknown_device(list),
            None => ngl != Some(0) && self.rpc.is_none() && !self.names_split(),
        }
    }

    /// Without `--device` and `-ngl`: the first GPU takes the model, unless `--rpc` (every
    /// remote device) or a split flag (over the default list, `CPU`) asks for a list.
    fn default_is_offload(&self) -> bool {
        self.rpc.is_none() && !self.names_split()
    }

    /// Whether `--split-mode tensor` or `--tensor-split` was given.
    fn names_split(&self) -> bool {
        self.split_mode == "tensor" || self.tensor_split.is_some()
    }

    /// `-ngl` places whole blocks on one GPU and the CPU: the flags that split otherwise are
    /// refused beside it, by name.
    fn check_offload_flags(&self) -> Result<(), CliError> {
        let ngl = self.n_gpu_layers.unwrap_or(GpuLayers::Auto);
        if self.split_mode == "tensor" {
            return Err(CliError::usage(format!(
                "-ngl {ngl} and --split-mode tensor do not combine: -ngl puts whole blocks on \
                 one GPU and the CPU (leave out -ngl to split every block over --device)"
            )));
        }
        if let Some(split) = &self.tensor_split {
            return Err(CliError::usage(format!(
                "-ngl {ngl} and --tensor-split {split} do not combine: -ngl counts the layers \
                 on the GPU (leave out -ngl to share the blocks over --device)"
            )));
        }
        Ok(())
    }

    /// `-ngl n` without `--device`: `n` layers on the first GPU, the rest on the CPU. Without
    /// a GPU the model runs on the CPU; an explicit `-ngl` says so on stderr (llama.cpp
    /// ignores `-ngl` there with a warning too: `-ngl 99` in a script works everywhere).
    fn offload_to_first_gpu(&self, n: usize) -> Result<Placement, CliError> {
        let cpu = host_cpu()?;
        if n == 0 {
            return Ok(Placement::Single(cpu));
        }
        match first_gpu() {
            Some(gpu) => Ok(Placement::Offload {
                gpu,
                cpu,
                n_gpu_layers: n,
            }),
            None => {
                if let Some(ngl) = self.n_gpu_layers.filter(|&g| g != GpuLayers::Auto) {
                    crate::note!(
                        "warning: -ngl {ngl}: no GPU found (a CPU driver such as lavapipe is \
                         used only when --device names it); running on the CPU"
                    );
                }
                Ok(Placement::Single(cpu))
            }
        }
    }

    /// `--device LIST -ngl n`: `n` layers on the list's first non-CPU device, the rest on its
    /// CPU device (the registry's `CPU` when it names none).
    fn offload_in_list(&self, list: &str, n: usize) -> Result<Placement, CliError> {
        let ngl = self.n_gpu_layers.unwrap_or(GpuLayers::Auto);
        let devices = named_devices(&split_names(list))?;
        let (cpus, gpus): (Vec<DeviceRef>, Vec<DeviceRef>) = devices
            .into_iter()
            .partition(|d| d.device_type() == DeviceType::Cpu);
        if gpus.len() > 1 || cpus.len() > 1 {
            return Err(CliError::usage(format!(
                "-ngl {ngl} with --device {list}: -ngl offloads to one GPU, so --device names \
                 one GPU and at most one CPU device (several devices: --split-mode layer \
                 without -ngl)"
            )));
        }
        let cpu = match cpus.into_iter().next() {
            Some(cpu) => cpu,
            None => host_cpu()?,
        };
        if n == 0 {
            return Ok(Placement::Single(cpu));
        }
        match gpus.into_iter().next() {
            Some(gpu) => Ok(Placement::Offload {
                gpu,
                cpu,
                n_gpu_layers: n,
            }),
            None => Err(CliError::usage(format!(
                "-ngl {ngl} with --device {list}: the list names no GPU to offload to"
            ))),
        }
    }

    /// The devices of [`device_list`](Self::device_list), split as `--split-mode` and
    /// `--tensor-split` say.
    fn list_placement(&self) -> Result<Placement, CliError> {
        let device_list = self.device_list()?;
        let mut names = split_names(&device_list);
        if names.is_empty() {
            return Err(CliError::usage("--device: no device named"));
        }
        let tensor_parallel = match self.split_mode.as_str() {
            "tensor" if names.len() < 2 => {
                return Err(CliError::usage(
                    "--split-mode tensor needs at least two devices in --device",
                ))
            }
            "tensor" => true,
            "none" => {
                names.truncate(1);
                false
            }
            _ => false,
        };
        let devices = named_devices(&names)?;
        let shares = self.tensor_split_shares(devices.len())?;
        Ok(if tensor_parallel {
            Placement::Tensor {
                devices,
                shares,
                sync: match self.tensor_sync.as_str() {
                    "reduce" => TensorSync::Reduce,
                    _ => TensorSync::Gather,
                },
            }
        } else {
            Placement::Layers { devices, shares }
        })
    }

    /// `--tensor-split`'s shares, one per device (empty: even).
    fn tensor_split_shares(&self, n_devices: usize) -> Result<Vec<f32>, CliError> {
        let Some(list) = &self.tensor_split else {
            return Ok(Vec::new());
        };
        let shares = list
            .split(',')
            .map(|v| {
                v.trim()
                    .parse::<f32>()
                    .ok()
                    .filter(|x| x.is_finite() && *x >= 0.0)
                    .ok_or_else(|| {
                        CliError::usage(format!(
                            "--tensor-split {list}: '{v}' is not a finite share >= 0"
                        ))
                    })
            })
            .collect::<Result<Vec<_>, CliError>>()?;
        if shares.len() != n_devices {
            return Err(CliError::usage(format!(
                "--tensor-split {list}: {} values for {n_devices} devices",
                shares.len()
            )));
        }
        Ok(shares)
    }

    /// The devices to use, comma-separated: `--device`, else every device of the `--rpc`
    /// servers (connected by then), else `CPU`.
    pub(crate) fn device_list(&self) -> Result<String, CliError> {
        if let Some(list) = &self.device {
            return Ok(list.clone());
        }
        let Some(rpc) = &self.rpc else {
            return Ok("CPU".into());
        };
        let mut names = Vec::new();
        for ep in crate::model_cmds::rpc_endpoints(rpc)? {
            let registry = rgml::registry::registries()
                .into_iter()
                .find(|r| r.name() == format!("RPC[{ep}]"))
                .ok_or_else(|| CliError::usage(format!("--rpc: server {ep} is not connected")))?;
            names.extend(registry.devices().iter().map(|d| d.name().to_string()));
        }
        if names.is_empty() {
            return Err(CliError::usage(format!(
                "--rpc {rpc}: the servers have no devices"
            )));
        }
        Ok(names.join(","))
    }
}

#[cfg(test)]
mod tests {
    use super::GpuLayers;

    #[test]
    fn gpu_layers_are_a_count_all_or_auto() {
        assert_eq!(GpuLayers::parse("0"), Ok(GpuLayers::Count(0)));
        assert_eq!(GpuLayers::parse("99"), Ok(GpuLayers::Count(99)));
        assert_eq!(GpuLayers::parse("all"), Ok(GpuLayers::All));
        assert_eq!(GpuLayers::parse("auto"), Ok(GpuLayers::Auto));
        for bad in ["-1", "half", "", "1.5"] {
            let e = GpuLayers::parse(bad).unwrap_err();
            assert!(e.contains("'all' or 'auto'"), "{bad}: {e}");
        }
        assert_eq!(GpuLayers::All.count(), Some(usize::MAX));
        assert_eq!(GpuLayers::Auto.count(), None);
        assert_eq!(GpuLayers::Count(7).to_string(), "7");
    }
}
