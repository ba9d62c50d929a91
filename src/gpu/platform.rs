//! Platform facts of a bench: the GPU's clocks against their maxima, its throttle reasons,
//! temperature and persistence mode, read through the monitor (NVML) while the bench runs, and
//! the host's CPU frequency governor. Read only: clocks are never set here (the GPUs may be
//! shared).
//!
//! Owns [`GpuReading`] (one read of one GPU), [`PlatformWatch`] (the readings of a bench folded
//! per GPU: the lowest SM clock while busy, every throttle reason seen, the hottest reading) and
//! [`BenchPlatform`] (what a bench records). Without NVML (declared or fake GPUs) there is no
//! reading, and a bench records only the governor.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Throttle reasons that slow a busy GPU down (power or thermal caps, hardware slowdowns).
/// Idle, application or user clock settings, sync boost and display clocks are not throttling.
pub const SLOWING: [&str; 5] = [
    "sw_power_cap",
    "hw_slowdown",
    "sw_thermal_slowdown",
    "hw_thermal_slowdown",
    "hw_power_brake_slowdown",
];

/// One read of one GPU.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct GpuReading {
    pub sm_mhz: Option<u32>,
    pub sm_max_mhz: Option<u32>,
    pub mem_mhz: Option<u32>,
    pub mem_max_mhz: Option<u32>,
    /// Active throttle reasons in NVML's words (`gpu_idle`, `sw_power_cap`, …).
    pub throttle: Vec<String>,
    pub temperature_c: Option<u32>,
    pub persistence: Option<bool>,
}

impl GpuReading {
    /// Whether the GPU was idle at this read (its clocks then say nothing of a bench).
    pub fn idle(&self) -> bool {
        self.throttle.iter().any(|t| t == "gpu_idle")
    }
}

/// What one bench records of its platform.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct BenchPlatform {
    /// The GPU the bench held, folded over the reads taken while it ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<GpuSummary>,
    /// `/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor`, where the host exposes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_governor: Option<String>,
}

impl BenchPlatform {
    /// Why this bench's timing is suspect, if the GPU slowed itself down while it ran.
    pub fn throttled(&self) -> Option<String> {
        let g = self.gpu.as_ref()?;
        let slowing: Vec<&str> = g
            .throttle
            .iter()
            .map(String::as_str)
            .filter(|t| SLOWING.contains(t))
            .collect();
        (!slowing.is_empty()).then(|| {
            let clocks = match (g.sm_min_busy_mhz, g.sm_max_mhz) {
                (Some(lo), Some(max)) => format!(", SM clock down to {lo} of {max} MHz"),
                _ => String::new(),
            };
            format!(
                "the GPU throttled while it ran ({}{clocks})",
                slowing.join(", ")
            )
        })
    }
}

/// The reads of one GPU over a bench.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct GpuSummary {
    pub uuid: String,
    pub reads: usize,
    /// The lowest SM clock among reads while the GPU was busy.
    pub sm_min_busy_mhz: Option<u32>,
    pub sm_max_mhz: Option<u32>,
    pub mem_min_busy_mhz: Option<u32>,
    pub mem_max_mhz: Option<u32>,
    /// Every throttle reason seen in any read, sorted.
    pub throttle: Vec<String>,
    pub temperature_max_c: Option<u32>,
    pub persistence: Option<bool>,
}

/// Folds the readings of every GPU taken while one bench ran.
#[derive(Clone, Debug, Default)]
pub struct PlatformWatch {
    gpus: BTreeMap<String, GpuSummary>,
}

impl PlatformWatch {
    pub fn add(&mut self, uuid: &str, r: &GpuReading) {
        let s = self
            .gpus
            .entry(uuid.to_string())
            .or_insert_with(|| GpuSummary {
                uuid: uuid.to_string(),
                ..GpuSummary::default()
            });
        s.reads += 1;
        let min = |a: Option<u32>, b: Option<u32>| match (a, b) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        if !r.idle() {
            s.sm_min_busy_mhz = min(s.sm_min_busy_mhz, r.sm_mhz);
            s.mem_min_busy_mhz = min(s.mem_min_busy_mhz, r.mem_mhz);
        }
        s.sm_max_mhz = s.sm_max_mhz.or(r.sm_max_mhz);
        s.mem_max_mhz = s.mem_max_mhz.or(r.mem_max_mhz);
        s.temperature_max_c = s.temperature_max_c.max(r.temperature_c);
        s.persistence = s.persistence.or(r.persistence);
        for t in &r.throttle {
            if !s.throttle.contains(t) {
                s.throttle.push(t.clone());
                s.throttle.sort();
            }
        }
    }

    /// What the bench that held `uuid` records.
    pub fn of(&self, uuid: Option<&str>) -> BenchPlatform {
        BenchPlatform {
            gpu: uuid.and_then(|u| self.gpus.get(u).cloned()),
            cpu_governor: cpu_governor(),
        }
    }
}

/// The host's CPU frequency governor (cpu0), where it is exposed.
pub fn cpu_governor() -> Option<String> {
    std::fs::read_to_string("/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

/// NVML's throttle bits in our words.
pub(crate) fn throttle_words(bits: nvml_wrapper::bitmasks::device::ThrottleReasons) -> Vec<String> {
    use nvml_wrapper::bitmasks::device::ThrottleReasons as T;
    [
        (T::GPU_IDLE, "gpu_idle"),
        (
            T::APPLICATIONS_CLOCKS_SETTING,
            "applications_clocks_setting",
        ),
        (T::SW_POWER_CAP, "sw_power_cap"),
        (T::HW_SLOWDOWN, "hw_slowdown"),
        (T::SYNC_BOOST, "sync_boost"),
        (T::SW_THERMAL_SLOWDOWN, "sw_thermal_slowdown"),
        (T::HW_THERMAL_SLOWDOWN, "hw_thermal_slowdown"),
        (T::HW_POWER_BRAKE_SLOWDOWN, "hw_power_brake_slowdown"),
        (T::DISPLAY_CLOCK_SETTING, "display_clock_setting"),
    ]
    .into_iter()
    .filter(|(bit, _)| bits.contains(*bit))
    .map(|(_, w)| w.to_string())
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(sm: u32, throttle: &[&str], temp: u32) -> GpuReading {
        GpuReading {
            sm_mhz: Some(sm),
            sm_max_mhz: Some(1980),
            mem_mhz: Some(2619),
            mem_max_mhz: Some(2619),
            throttle: throttle.iter().map(|s| s.to_string()).collect(),
            temperature_c: Some(temp),
            persistence: Some(true),
        }
    }

    #[test]
    fn idle_reads_do_not_count_as_a_slow_clock_and_only_slowing_reasons_flag_a_bench() {
        let mut w = PlatformWatch::default();
        w.add("GPU-a", &read(345, &["gpu_idle"], 41));
        w.add("GPU-a", &read(1980, &[], 44));
        w.add("GPU-b", &read(1410, &["sw_power_cap"], 83));
        let a = w.of(Some("GPU-a"));
        let g = a.gpu.clone().unwrap();
        assert_eq!(
            (g.reads, g.sm_min_busy_mhz, g.temperature_max_c),
            (2, Some(1980), Some(44))
        );
        assert_eq!(a.throttled(), None, "idle is no throttling");
        assert_eq!(
            w.of(Some("GPU-b")).throttled().as_deref(),
            Some(
                "the GPU throttled while it ran (sw_power_cap, SM clock down to 1410 of 1980 MHz)"
            )
        );
        assert_eq!(w.of(None).gpu, None);
    }

    #[test]
    fn nvml_bits_read_in_our_words() {
        use nvml_wrapper::bitmasks::device::ThrottleReasons as T;
        assert_eq!(
            throttle_words(T::GPU_IDLE | T::HW_SLOWDOWN),
            ["gpu_idle", "hw_slowdown"]
        );
    }
}
