//! Copies of device tensors between GPUs of one machine, outside NCCL:
//! [`CudaBackend::copy_to`].

use std::collections::HashSet;
use std::sync::Mutex;

use compute_core::{Backend, ComputeError, Result, Tensor};

use super::device::lock;
use super::{CudaBackend, CudaBuffer, driver, tensor_bytes};

/// The `(reader, owner)` device pairs whose peer access is set up: the
/// driver calls run once per pair and process.
static PEERS: Mutex<Option<HashSet<(u32, u32)>>> = Mutex::new(None);

impl CudaBackend {
    /// A copy of `src` (a tensor on this backend's device) on `to`'s device,
    /// queued without waiting. Between two devices the copy runs on `to`'s
    /// stream after the work queued so far on this one, and this device's
    /// stream waits for it (so `src` can be dropped or overwritten at once);
    /// NVLink or PCIe peer-to-peer is enabled where the driver has it, else the
    /// driver stages the bytes through the host. On one device it is a
    /// device copy. Costs the tensor's bytes over the link between the two
    /// GPUs (or twice over the host link without peer access); `WrongDevice`
    /// when `src` is not on this device, `OutOfMemory` on `to`.
    pub fn copy_to(&self, src: &Tensor, to: &CudaBackend) -> Result<Tensor> {
        let op = "copy_to";
        let buffer =
            src.storage::<CudaBuffer>().filter(|b| b.allocation().ordinal() == self.dev.ordinal).ok_or_else(|| {
                ComputeError::WrongDevice {
                    op,
                    expected: self.location().to_string(),
                    found: src.location().to_string(),
                }
            })?;
        let bytes = tensor_bytes(op, src.len(), src.dtype())?;
        let out = to.alloc_typed(src.len(), src.dtype())?;
        let dst = out.storage::<CudaBuffer>().map(CudaBuffer::device_ptr).ok_or_else(|| ComputeError::WrongDevice {
            op,
            expected: to.location().to_string(),
            found: out.location().to_string(),
        })?;
        if bytes == 0 {
            return Ok(out);
        }
        if to.dev.ordinal == self.dev.ordinal {
            driver::dtod(&self.dev.stream, dst, buffer.device_ptr(), bytes, op)?;
            return Ok(out);
        }
        let pair = (to.dev.ordinal, self.dev.ordinal);
        if !lock(&PEERS).get_or_insert_with(HashSet::new).contains(&pair) {
            driver::enable_peer_access(&to.dev.ctx, &self.dev.ctx, op)?;
            lock(&PEERS).get_or_insert_with(HashSet::new).insert(pair);
        }
        let event = |s: &cudarc::driver::CudaStream| s.record_event(None).map_err(|e| driver::err(op, e));
        // The copy after everything queued on the source so far ...
        to.dev.stream.wait(&event(&self.dev.stream)?).map_err(|e| driver::err(op, e))?;
        driver::dtod_peer(&to.dev.stream, dst, &self.dev.ctx, buffer.device_ptr(), bytes, op)?;
        // ... and the source's later work (its free included) after the copy.
        self.dev.stream.wait(&event(&to.dev.stream)?).map_err(|e| driver::err(op, e))?;
        Ok(out)
    }
}
