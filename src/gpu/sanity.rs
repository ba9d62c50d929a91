//! The sanity kernel: proof that a GPU still computes after a failed lease.
//!
//! Creates a context on the GPU (found by UUID among the driver's ordinals), JIT-loads an
//! embedded PTX fill kernel (no NVRTC needed), fills 1M integers and checks them on the host.
//! libcuda is loaded at run time; cudarc panics without it, so its presence is checked first
//! and its absence is a [`LeaseError::CudaUnavailable`], never a panic.

use std::ffi::{CStr, c_void};
use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::{CudaContext, CudaStream, DevicePtrMut, DriverError, result, sys};
use serde::{Deserialize, Serialize};

use super::types::LeaseError;

const ELEMENTS: u32 = 1 << 20;

const FILL_PTX: &CStr = cr#"
.version 7.0
.target sm_50
.address_size 64

.visible .entry fk_fill(
    .param .u64 p_out,
    .param .u32 p_n
)
{
    .reg .pred %p<2>;
    .reg .b32 %r<7>;
    .reg .b64 %rd<4>;

    ld.param.u64 %rd1, [p_out];
    ld.param.u32 %r1, [p_n];
    mov.u32 %r2, %ctaid.x;
    mov.u32 %r3, %ntid.x;
    mov.u32 %r4, %tid.x;
    mad.lo.s32 %r5, %r2, %r3, %r4;
    setp.ge.u32 %p1, %r5, %r1;
    @%p1 bra DONE;
    cvta.to.global.u64 %rd2, %rd1;
    mul.wide.u32 %rd3, %r5, 4;
    add.s64 %rd2, %rd2, %rd3;
    shl.b32 %r6, %r5, 1;
    add.s32 %r6, %r6, 1;
    st.global.u32 [%rd2], %r6;
DONE:
    ret;
}
"#;

/// The result of one sanity run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SanityReport {
    pub uuid: String,
    pub ordinal: usize,
    pub name: String,
    pub elements: u32,
    pub elapsed_ms: u64,
    /// Elements whose value was wrong (0 on a healthy GPU).
    pub mismatches: u64,
}

impl SanityReport {
    pub fn passed(&self) -> bool {
        self.mismatches == 0
    }
}

fn cuda(e: DriverError) -> LeaseError {
    LeaseError::CudaUnavailable(format!("{e:?}"))
}

/// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`, as NVML spells it.
fn uuid_string(u: &sys::CUuuid) -> String {
    let b: Vec<u8> = u.bytes.iter().map(|c| *c as u8).collect();
    let hex = |r: std::ops::Range<usize>| crate::digest::hex(&b[r]);
    format!(
        "GPU-{}-{}-{}-{}-{}",
        hex(0..4),
        hex(4..6),
        hex(6..8),
        hex(8..10),
        hex(10..16)
    )
}

/// Runs the sanity kernel on the GPU with this UUID. Blocking: call it off the async runtime.
pub fn run_sanity(uuid: &str) -> Result<SanityReport, LeaseError> {
    // cudarc would panic without libcuda.
    // SAFETY: only tries dlopen on libcuda's names; no CUDA call is made.
    if !unsafe { sys::is_culib_present() } {
        return Err(LeaseError::CudaUnavailable(
            "libcuda.so cannot be loaded (no NVIDIA driver)".into(),
        ));
    }
    let start = Instant::now();
    let ordinal = ordinal_of(uuid)?;
    let ctx = CudaContext::new(ordinal).map_err(cuda)?;
    let name = ctx.name().unwrap_or_default();
    let stream = ctx.default_stream();
    ctx.bind_to_thread().map_err(cuda)?;
    // SAFETY: `FILL_PTX` is a NUL-terminated PTX text that outlives the call.
    let module =
        unsafe { result::module::load_data(FILL_PTX.as_ptr() as *const c_void) }.map_err(cuda)?;
    let host = fill(&stream, module);
    // SAFETY: no function of the module is used after this point.
    let _ = unsafe { result::module::unload(module) };
    let host = host.map_err(cuda)?;
    let mismatches = host
        .iter()
        .enumerate()
        .filter(|(i, v)| **v != (*i as u32).wrapping_mul(2).wrapping_add(1))
        .count() as u64;
    Ok(SanityReport {
        uuid: uuid.to_string(),
        ordinal,
        name,
        elements: ELEMENTS,
        elapsed_ms: start.elapsed().as_millis() as u64,
        mismatches,
    })
}

/// The driver's ordinal of the GPU with this UUID.
fn ordinal_of(uuid: &str) -> Result<usize, LeaseError> {
    let count = CudaContext::device_count().map_err(cuda)?;
    let ordinal = (0..count)
        .find(|&i| {
            result::device::get(i)
                .and_then(result::device::get_uuid)
                .is_ok_and(|u| uuid_string(&u) == uuid)
        })
        .ok_or_else(|| LeaseError::UnknownGpu(uuid.to_string()))?;
    Ok(ordinal as usize)
}

/// Runs the fill kernel of `module` (loaded from [`FILL_PTX`]) and reads its buffer back.
fn fill(stream: &Arc<CudaStream>, module: sys::CUmodule) -> Result<Vec<u32>, DriverError> {
    // SAFETY: `module` was loaded from `FILL_PTX`, so it names an entry `fk_fill`.
    let func = unsafe { result::module::get_function(module, c"fk_fill".to_owned()) }?;
    let mut buf = stream.alloc_zeros::<u32>(ELEMENTS as usize)?;
    {
        let (mut ptr, _sync) = buf.device_ptr_mut(stream);
        let mut n = ELEMENTS;
        let mut params = [
            (&mut ptr) as *mut _ as *mut c_void,
            (&mut n) as *mut _ as *mut c_void,
        ];
        let blocks = ELEMENTS.div_ceil(256);
        // SAFETY: the parameters match the kernel's (.u64 p_out, .u32 p_n) and the buffer
        // holds `n` u32 values.
        unsafe {
            result::launch_kernel(
                func,
                (blocks, 1, 1),
                (256, 1, 1),
                0,
                stream.cu_stream(),
                &mut params,
            )
        }?;
    }
    let host = stream.clone_dtoh(&buf)?;
    stream.synchronize()?;
    Ok(host)
}
