//! The `[gpus]` section: where the GPUs come from, the profiler caps, and where lease cgroups
//! live. Validated into [`GpuSettings`]; every rejection names its `gpus.*` key.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{ConfigError, SettingMap, SettingSource, parse_count};

/// The default cgroup filesystem.
pub const DEFAULT_CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// Where the GPUs come from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum GpuDevices {
    /// Discover with NVML at start.
    Nvml,
    /// `n` declared fake GPUs (for machines without NVIDIA drivers, and the simulation).
    Fake { count: u32 },
    /// An explicit list of GPU UUIDs.
    Uuids { uuids: Vec<String> },
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawGpus {
    devices: Option<toml::Value>,
    ncu_cap: Option<i64>,
    nsys_cap: Option<i64>,
    cgroup_root: Option<String>,
    /// `"local"` or `"slurm"`; validated with the `[slurm]` table (`super::slurm`).
    pub(super) backend: Option<String>,
}

/// `[gpus]`, validated.
pub(super) struct GpuSettings {
    pub devices: GpuDevices,
    pub ncu_cap: usize,
    pub nsys_cap: usize,
    pub cgroup_root: Option<PathBuf>,
}

pub(super) fn validate(
    raw: RawGpus,
    sim: bool,
    settings: &mut SettingMap,
) -> Result<GpuSettings, ConfigError> {
    let key = "gpus.devices";
    let (devices, source) = match raw.devices {
        None => (GpuDevices::Nvml, SettingSource::Default),
        Some(toml::Value::String(s)) => (parse_devices(key, &s)?, SettingSource::File),
        Some(toml::Value::Array(items)) => {
            let uuids = super::unique_strings(
                key,
                items,
                |u| u.starts_with("GPU-") || u.starts_with("MIG-"),
                "each GPU UUID once (a GPU listed twice would be leased twice)",
                "GPU UUIDs such as \"GPU-8f2c…\"",
            )?;
            if uuids.is_empty() {
                return Err(ConfigError::new(key, "[]", "at least one GPU UUID"));
            }
            (GpuDevices::Uuids { uuids }, SettingSource::File)
        }
        Some(other) => return Err(ConfigError::new(key, other.to_string(), DEVICES)),
    };
    // The simulation's fake GPUs replace the setting, which was checked all the same.
    let (devices, source) = if sim {
        (GpuDevices::Fake { count: 8 }, SettingSource::Flag)
    } else {
        (devices, source)
    };
    super::record(settings, key, describe_devices(&devices), source);
    let mut cap = |k: &str, v: Option<i64>, default: i64| {
        let (v, source) = super::layered(None, v, || default);
        super::record(settings, k, v, source);
        parse_count(k, &v.to_string(), 1, 64)
    };
    let ncu_cap = cap("gpus.ncu_cap", raw.ncu_cap, 1)?;
    let nsys_cap = cap("gpus.nsys_cap", raw.nsys_cap, 2)?;
    let cgroup_root = cgroup_root(raw.cgroup_root, settings)?;
    Ok(GpuSettings {
        devices,
        ncu_cap,
        nsys_cap,
        cgroup_root,
    })
}

/// What `gpus.devices` may be.
const DEVICES: &str = "\"nvml\", \"fake:N\" or a list of GPU UUIDs";

fn parse_devices(key: &str, s: &str) -> Result<GpuDevices, ConfigError> {
    if s == "nvml" {
        return Ok(GpuDevices::Nvml);
    }
    if let Some(n) = s.strip_prefix("fake:") {
        return match n.parse::<u32>() {
            Ok(count) if (1..=64).contains(&count) => Ok(GpuDevices::Fake { count }),
            _ => Err(ConfigError::new(key, s, "\"fake:N\" with N from 1 to 64")),
        };
    }
    Err(ConfigError::new(key, s, DEVICES))
}

/// A one-line description of a device setting, e.g. `fake:8`.
pub fn describe_devices(d: &GpuDevices) -> String {
    match d {
        GpuDevices::Nvml => "nvml".into(),
        GpuDevices::Fake { count } => format!("fake:{count}"),
        GpuDevices::Uuids { uuids } => uuids.join(","),
    }
}

/// `gpus.cgroup_root`: `"off"`, or an absolute path. A configured path must be a directory
/// (a typo would otherwise silently leave leases without cgroups); the default may be absent,
/// and the broker then says it keeps to process groups.
fn cgroup_root(
    raw: Option<String>,
    settings: &mut SettingMap,
) -> Result<Option<PathBuf>, ConfigError> {
    let key = "gpus.cgroup_root";
    let (value, source) = super::layered(None, raw, || DEFAULT_CGROUP_ROOT.to_string());
    super::record(settings, key, &value, source);
    if value == "off" {
        return Ok(None);
    }
    let path = Path::new(&value);
    if !path.is_absolute() {
        return Err(ConfigError::new(
            key,
            &value,
            "\"off\" or an absolute path such as \"/sys/fs/cgroup\"",
        ));
    }
    if source == SettingSource::File && !path.is_dir() {
        return Err(ConfigError::because(
            key,
            &value,
            "no such directory (use \"off\" to run leases in process groups only)",
        ));
    }
    Ok(Some(path.to_path_buf()))
}
