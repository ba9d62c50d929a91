//! GPU health: which Xids are the job's fault and which are the GPU's, and the NVML event
//! watcher that reports them to the broker.
//!
//! Application Xids (13, 31, 43, 45, 68, 109) are charged to the job; any other Xid, and
//! double-bit ECC errors, drain the GPU and fail the lease as infrastructure (the same split
//! NVIDIA's k8s device plugin makes).

use std::sync::Arc;

use nvml_wrapper::Nvml;
use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enums::event::XidError;

/// Xids caused by the application itself.
pub const APPLICATION_XIDS: [u64; 6] = [13, 31, 43, 45, 68, 109];

/// A health event on one GPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GpuEvent {
    Xid {
        xid: u64,
    },
    DoubleBitEcc,
    /// A check the broker ran failed (sanity kernel, unkillable memory).
    CheckFailed {
        detail: String,
    },
}

/// What an event means for the lease holding the GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum XidDisposition {
    /// The job's own fault: recorded on its outcome.
    ChargeJob,
    /// The GPU's fault: drain it, fail the lease as infra.
    DrainGpu,
}

/// Classifies an event.
pub fn classify_xid(event: &GpuEvent) -> XidDisposition {
    match event {
        GpuEvent::Xid { xid } if APPLICATION_XIDS.contains(xid) => XidDisposition::ChargeJob,
        _ => XidDisposition::DrainGpu,
    }
}

/// Watches NVML events on every GPU on a plain thread (NVML's wait blocks) until `stop` is
/// cancelled.
/// Each event goes to `report(uuid, event)`.
pub(crate) fn spawn_watcher(
    nvml: Arc<Nvml>,
    uuids: Vec<String>,
    stop: tokio_util::sync::CancellationToken,
    report: Arc<dyn Fn(String, GpuEvent) + Send + Sync>,
) {
    let builder = std::thread::Builder::new().name("fk-nvml-events".into());
    let _ = builder.spawn(move || {
        let Ok(mut set) = nvml.create_event_set() else {
            tracing::warn!("NVML event sets are not supported: Xid watching is off");
            return;
        };
        let kinds = EventTypes::CRITICAL_XID_ERROR | EventTypes::DOUBLE_BIT_ECC_ERROR;
        for uuid in &uuids {
            let Ok(dev) = nvml.device_by_uuid(uuid.as_str()) else {
                continue;
            };
            set = match dev.register_events(kinds, set) {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(gpu = %uuid, error = %e.error, "cannot watch Xid events");
                    return;
                }
            };
        }
        while !stop.is_cancelled() {
            let Ok(ev) = set.wait(500) else { continue };
            let Ok(uuid) = ev.device.uuid() else { continue };
            let event = if ev.event_type.contains(EventTypes::DOUBLE_BIT_ECC_ERROR) {
                GpuEvent::DoubleBitEcc
            } else {
                match ev.event_data {
                    Some(XidError::Value(xid)) => GpuEvent::Xid { xid },
                    _ => GpuEvent::CheckFailed {
                        detail: "critical Xid of unknown value".into(),
                    },
                }
            };
            report(uuid, event);
        }
    });
}
