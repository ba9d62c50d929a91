//! The GPUs the broker may lend, and the NVML view of what runs on them.
//!
//! Owns discovery (NVML at run time, or a declared list for hosts without NVIDIA drivers) and
//! the [`GpuMonitor`] seam through which the broker audits processes and memory. Declared and
//! fake GPUs have no monitor facts: reclaim then relies on the process group alone, and
//! every outcome says so.

use std::sync::Arc;

use nvml_wrapper::Nvml;
use nvml_wrapper::enum_wrappers::device::Brand;
use nvml_wrapper::enums::device::UsedGpuMemory;

use super::types::{GpuSnapshot, GpuState, LeaseError, Snapshot};
use crate::config::GpuDevices;

/// Where the inventory came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InventorySource {
    Nvml,
    /// UUIDs declared in the config, on a host without NVML.
    Declared,
    /// `fake:N`: simulated GPUs for CI and `--sim`.
    Fake,
    /// GPUs of Slurm nodes, held through the Slurm backend (`crate::gpu::slurm`).
    Slurm,
}

crate::words!(InventorySource {
    Nvml = "nvml",
    Declared = "declared",
    Fake = "fake",
    Slurm = "slurm",
});

/// One GPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuInfo {
    /// NVML index (or declaration order).
    pub index: u32,
    pub uuid: String,
    pub name: String,
    pub memory_total_bytes: Option<u64>,
    /// Memory in use when the broker started: reclaim waits for the GPU to come back near it.
    pub baseline_used_bytes: Option<u64>,
}

impl GpuInfo {
    /// A GPU without NVML facts (no memory size or baseline).
    pub fn unobserved(index: u32, uuid: String, name: String) -> Self {
        GpuInfo {
            index,
            uuid,
            name,
            memory_total_bytes: None,
            baseline_used_bytes: None,
        }
    }

    /// This GPU as `fk-agentd gpus` shows it in `state`, held by no lease.
    pub(crate) fn snapshot(&self, state: GpuState) -> GpuSnapshot {
        GpuSnapshot {
            index: self.index,
            uuid: self.uuid.clone(),
            name: self.name.clone(),
            memory_total_bytes: self.memory_total_bytes,
            state,
            lease_id: None,
            session: None,
            class: None,
            drained_reason: None,
        }
    }
}

/// A process NVML lists on a GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GpuProcess {
    pub pid: u32,
    pub used_bytes: Option<u64>,
}

/// What the broker asks about the GPUs while leases run.
pub trait GpuMonitor: Send + Sync + 'static {
    /// Compute processes on a GPU. `Ok(vec![])` when the monitor cannot see processes.
    fn processes(&self, uuid: &str) -> Result<Vec<GpuProcess>, String>;
    /// Memory in use on a GPU, when known.
    fn memory_used(&self, uuid: &str) -> Option<u64>;
    /// The NVML handle, for the Xid event watcher.
    fn nvml(&self) -> Option<Arc<Nvml>> {
        None
    }
    /// Clocks, throttle reasons, temperature and persistence of a GPU, when observable.
    fn reading(&self, _uuid: &str) -> Option<super::platform::GpuReading> {
        None
    }
}

/// Declared or fake GPUs: nothing is observable.
#[derive(Debug, Default)]
pub struct DeclaredMonitor;

impl GpuMonitor for DeclaredMonitor {
    fn processes(&self, _uuid: &str) -> Result<Vec<GpuProcess>, String> {
        Ok(Vec::new())
    }
    fn memory_used(&self, _uuid: &str) -> Option<u64> {
        None
    }
}

/// NVML-backed monitor.
pub struct NvmlMonitor {
    nvml: Arc<Nvml>,
}

impl GpuMonitor for NvmlMonitor {
    fn processes(&self, uuid: &str) -> Result<Vec<GpuProcess>, String> {
        let dev = self.nvml.device_by_uuid(uuid).map_err(|e| e.to_string())?;
        let procs = dev.running_compute_processes().map_err(|e| e.to_string())?;
        Ok(procs
            .into_iter()
            .map(|p| GpuProcess {
                pid: p.pid,
                used_bytes: match p.used_gpu_memory {
                    UsedGpuMemory::Used(b) => Some(b),
                    UsedGpuMemory::Unavailable => None,
                },
            })
            .collect())
    }

    fn memory_used(&self, uuid: &str) -> Option<u64> {
        let dev = self.nvml.device_by_uuid(uuid).ok()?;
        dev.memory_info().ok().map(|m| m.used)
    }

    fn nvml(&self) -> Option<Arc<Nvml>> {
        Some(self.nvml.clone())
    }

    fn reading(&self, uuid: &str) -> Option<super::platform::GpuReading> {
        use nvml_wrapper::enum_wrappers::device::{Clock, TemperatureSensor};
        let dev = self.nvml.device_by_uuid(uuid).ok()?;
        Some(super::platform::GpuReading {
            sm_mhz: dev.clock_info(Clock::SM).ok(),
            sm_max_mhz: dev.max_clock_info(Clock::SM).ok(),
            mem_mhz: dev.clock_info(Clock::Memory).ok(),
            mem_max_mhz: dev.max_clock_info(Clock::Memory).ok(),
            throttle: dev
                .current_throttle_reasons()
                .map(super::platform::throttle_words)
                .unwrap_or_default(),
            temperature_c: dev.temperature(TemperatureSensor::Gpu).ok(),
            persistence: dev.is_in_persistent_mode().ok(),
        })
    }
}

/// The GPUs and how to observe them.
#[derive(Clone)]
pub struct Inventory {
    pub source: InventorySource,
    pub gpus: Vec<GpuInfo>,
    pub(crate) monitor: Arc<dyn GpuMonitor>,
}

impl std::fmt::Debug for Inventory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inventory")
            .field("source", &self.source)
            .field("gpus", &self.gpus)
            .finish()
    }
}

/// The node in a Slurm slot's id (`slurm:<node>:gpu<n>`); `None` for any other id.
pub fn node_of_uuid(uuid: &str) -> Option<&str> {
    Some(uuid.strip_prefix("slurm:")?.rsplit_once(':')?.0)
}

fn nvml_err(e: nvml_wrapper::error::NvmlError) -> LeaseError {
    LeaseError::NvmlUnavailable { why: e.to_string() }
}

impl Inventory {
    /// Whether the GPUs' clocks and throttle reasons can be read (NVML).
    pub fn observable(&self) -> bool {
        self.monitor.nvml().is_some()
    }

    /// What a calibration of benches on these GPUs holds for: their model names; on Slurm the
    /// nodes, since a slot's name carries its holder job, which every campaign changes, and the
    /// model is not observed from here. `None` without GPUs.
    pub fn calibration_model(&self) -> Option<String> {
        let mut names: Vec<String> = if self.source == InventorySource::Slurm {
            self.gpus
                .iter()
                .filter_map(|g| Some(format!("Slurm node {}", node_of_uuid(&g.uuid)?)))
                .collect()
        } else {
            self.gpus.iter().map(|g| g.name.clone()).collect()
        };
        names.sort();
        names.dedup();
        (!names.is_empty()).then(|| names.join(" + "))
    }

    /// The node of the GPU in slot `slot` where GPUs lie on several (a Slurm node's name, from
    /// the id `slurm:<node>:gpu<n>`); `None` for GPUs of this host.
    pub fn node_of(&self, slot: usize) -> Option<String> {
        let uuid = &self.gpus.get(slot)?.uuid;
        node_of_uuid(uuid).map(str::to_string)
    }

    /// One reading of every GPU that gives one.
    pub fn readings(&self) -> Vec<(String, super::platform::GpuReading)> {
        self.gpus
            .iter()
            .filter_map(|g| Some((g.uuid.clone(), self.monitor.reading(&g.uuid)?)))
            .collect()
    }

    /// Discovers the GPUs the config names. `nvml` without a loadable NVML is an error.
    pub fn discover(devices: &GpuDevices) -> Result<Self, LeaseError> {
        match devices {
            GpuDevices::Nvml => Self::from_nvml(Arc::new(Nvml::init().map_err(nvml_err)?), None),
            GpuDevices::Fake { count } => Ok(Self::fake(*count)),
            GpuDevices::Uuids { uuids } => match Nvml::init() {
                Ok(nvml) => Self::from_nvml(Arc::new(nvml), Some(uuids)),
                Err(_) => Ok(Self::declared(uuids)),
            },
        }
    }

    /// `count` simulated GPUs with stable fake UUIDs.
    pub fn fake(count: u32) -> Self {
        let gpus = (0..count)
            .map(|i| {
                let uuid = format!("GPU-fa4e0000-0000-4000-8000-{i:012}");
                GpuInfo::unobserved(i, uuid, "simulated GPU (fake)".into())
            })
            .collect();
        Self::unobserved(InventorySource::Fake, gpus)
    }

    /// GPUs of which nothing is observable from this host (declared, fake, on Slurm nodes).
    pub fn unobserved(source: InventorySource, gpus: Vec<GpuInfo>) -> Self {
        Self {
            source,
            gpus,
            monitor: Arc::new(DeclaredMonitor),
        }
    }

    fn declared(uuids: &[String]) -> Self {
        let gpus = uuids
            .iter()
            .enumerate()
            .map(|(i, u)| GpuInfo::unobserved(i as u32, u.clone(), "declared GPU (no NVML)".into()))
            .collect();
        Self::unobserved(InventorySource::Declared, gpus)
    }

    fn from_nvml(nvml: Arc<Nvml>, only: Option<&Vec<String>>) -> Result<Self, LeaseError> {
        let count = nvml.device_count().map_err(nvml_err)?;
        let mut gpus = Vec::new();
        for i in 0..count {
            let dev = nvml.device_by_index(i).map_err(nvml_err)?;
            let uuid = dev.uuid().map_err(nvml_err)?;
            if only.is_some_and(|o| !o.contains(&uuid)) {
                continue;
            }
            let mem = dev.memory_info().ok();
            let name = dev.name().unwrap_or_else(|_| match dev.brand() {
                Ok(Brand::Nvidia) => "NVIDIA GPU".into(),
                _ => "GPU".into(),
            });
            gpus.push(GpuInfo {
                index: i,
                uuid,
                name,
                memory_total_bytes: mem.as_ref().map(|m| m.total),
                baseline_used_bytes: mem.as_ref().map(|m| m.used),
            });
        }
        if let Some(only) = only
            && let Some(missing) = only.iter().find(|u| !gpus.iter().any(|g| &g.uuid == *u))
        {
            return Err(LeaseError::UnknownGpu(missing.clone()));
        }
        if gpus.is_empty() {
            return Err(LeaseError::NvmlUnavailable {
                why: "NVML loaded but lists no GPUs".into(),
            });
        }
        Ok(Self {
            source: InventorySource::Nvml,
            gpus,
            monitor: Arc::new(NvmlMonitor { nvml }),
        })
    }

    /// Replaces the monitor (tests script GPU processes and memory with this).
    pub fn with_monitor(mut self, monitor: Arc<dyn GpuMonitor>) -> Self {
        self.monitor = monitor;
        self
    }

    /// What `fk-agentd gpus` shows when no daemon runs: the inventory, state `no_daemon`.
    pub fn offline_snapshot(&self) -> Snapshot {
        Snapshot {
            source: self.source.as_str().to_string(),
            gpus: self
                .gpus
                .iter()
                .map(|g| g.snapshot(GpuState::NoDaemon))
                .collect(),
            queue: Vec::new(),
        }
    }

    pub fn len(&self) -> usize {
        self.gpus.len()
    }

    pub fn is_empty(&self) -> bool {
        self.gpus.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_calibration_holds_for_the_gpu_models_or_on_slurm_for_the_nodes() {
        let gpu = |i: u32, uuid: &str, name: &str| GpuInfo::unobserved(i, uuid.into(), name.into());
        let local = Inventory::unobserved(
            InventorySource::Declared,
            vec![
                gpu(0, "GPU-a", "NVIDIA H100 80GB HBM3"),
                gpu(1, "GPU-b", "NVIDIA H100 80GB HBM3"),
            ],
        );
        assert_eq!(
            local.calibration_model().as_deref(),
            Some("NVIDIA H100 80GB HBM3")
        );
        // The holder job in a slot's name changes with every campaign; the nodes do not.
        let slurm = |job: u32| {
            Inventory::unobserved(
                InventorySource::Slurm,
                vec![
                    gpu(
                        0,
                        "slurm:n2:gpu0",
                        &format!("Slurm n2 GPU 0 (holder job {job})"),
                    ),
                    gpu(
                        1,
                        "slurm:n1:gpu0",
                        &format!("Slurm n1 GPU 0 (holder job {job})"),
                    ),
                    gpu(
                        2,
                        "slurm:n1:gpu1",
                        &format!("Slurm n1 GPU 1 (holder job {job})"),
                    ),
                ],
            )
        };
        assert_eq!(
            slurm(7).calibration_model().as_deref(),
            Some("Slurm node n1 + Slurm node n2")
        );
        assert_eq!(slurm(7).calibration_model(), slurm(8).calibration_model());
        assert_eq!(Inventory::fake(0).calibration_model(), None);
    }
}
