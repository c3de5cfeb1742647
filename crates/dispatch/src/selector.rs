//! [`BackendSelector`]: the "5× PCIe rule", exactly as trueno specifies it.
//!
//! GPU only if `compute_time > min_dispatch_ratio × transfer_time`, with
//! `transfer_time = data_bytes / pcie_bandwidth` and `compute_time = flops /
//! gpu_flops`. It ignores launch latency, the CPU's own speed and whether the
//! data is already on the device; with its defaults (32 GB/s, 20 TFLOP/s, 5×)
//! a square matmul goes to the GPU only above n ≈ 18 750, so it keeps a 2048³
//! matmul on the CPU. Kept for comparison (`cargo xtask bench --dispatch`
//! reports its regret) and for users who ask for it by name;
//! [`crate::Compute::auto`] uses the measured [`crate::CostModel`] instead.

use compute_core::Op;

/// The selector's answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SelectedBackend {
    /// Run on the CPU (SIMD).
    Simd,
    /// Run on the GPU.
    Gpu,
}

/// The 5× PCIe rule's cost model: fixed bus bandwidth, fixed GPU throughput, fixed ratio.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BackendSelector {
    pcie_bandwidth: f64,
    gpu_flops: f64,
    min_dispatch_ratio: f64,
}

impl Default for BackendSelector {
    fn default() -> Self {
        Self::new()
    }
}

impl BackendSelector {
    /// PCIe 4.0 x16 (32 GB/s), an A100-class 20 TFLOP/s, ratio 5.
    pub fn new() -> Self {
        BackendSelector { pcie_bandwidth: 32e9, gpu_flops: 20e12, min_dispatch_ratio: 5.0 }
    }

    /// Sets the bus bandwidth in bytes per second (e.g. `64e9` for PCIe 5.0).
    pub fn with_pcie_bandwidth(mut self, bytes_per_s: f64) -> Self {
        self.pcie_bandwidth = bytes_per_s;
        self
    }

    /// Sets the GPU throughput in FLOP per second (trueno's name says "gflops"
    /// but its callers pass FLOP/s: `40e12` for an RTX 4090).
    pub fn with_gpu_gflops(mut self, flops_per_s: f64) -> Self {
        self.gpu_flops = flops_per_s;
        self
    }

    /// Sets the ratio compute time must exceed transfer time by.
    pub fn with_min_dispatch_ratio(mut self, ratio: f64) -> Self {
        self.min_dispatch_ratio = ratio;
        self
    }

    /// Bus bandwidth, bytes per second.
    pub fn pcie_bandwidth(&self) -> f64 {
        self.pcie_bandwidth
    }

    /// GPU throughput, FLOP per second.
    pub fn gpu_flops(&self) -> f64 {
        self.gpu_flops
    }

    /// The dispatch ratio.
    pub fn min_dispatch_ratio(&self) -> f64 {
        self.min_dispatch_ratio
    }

    /// `data_bytes / pcie_bandwidth`.
    pub fn transfer_seconds(&self, data_bytes: u64) -> f64 {
        data_bytes as f64 / self.pcie_bandwidth
    }

    /// `flops / gpu_flops`.
    pub fn compute_seconds(&self, flops: u64) -> f64 {
        flops as f64 / self.gpu_flops
    }

    /// GPU if `compute_seconds(flops) > ratio × transfer_seconds(data_bytes)`.
    /// Two divisions and a compare.
    pub fn select_backend(&self, data_bytes: u64, flops: u64) -> SelectedBackend {
        if self.compute_seconds(flops) > self.min_dispatch_ratio * self.transfer_seconds(data_bytes) {
            SelectedBackend::Gpu
        } else {
            SelectedBackend::Simd
        }
    }

    /// The rule for an `m × k` by `k × n` matmul: `2·m·k·n` FLOPs over the
    /// `4·(m·k + k·n + m·n)` bytes of both inputs and the output.
    pub fn select_for_matmul(&self, m: usize, k: usize, n: usize) -> SelectedBackend {
        self.select_for_op(&Op::matmul(m, k, n))
    }

    /// The rule for any op, from [`Op::cost`] (bytes read + written).
    pub fn select_for_op(&self, op: &Op) -> SelectedBackend {
        let cost = op.cost();
        self.select_backend(cost.bytes(), cost.flops)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_truenos() {
        let s = BackendSelector::new();
        assert_eq!((s.pcie_bandwidth(), s.gpu_flops(), s.min_dispatch_ratio()), (32e9, 20e12, 5.0));
    }

    #[test]
    fn arithmetic_matches_hand_computed_cases() {
        let s = BackendSelector::new();
        // 1 MB over 32 GB/s = 31.25 µs; 1 GFLOP at 20 TFLOP/s = 50 µs.
        assert!((s.transfer_seconds(1_000_000) - 31.25e-6).abs() < 1e-12);
        assert!((s.compute_seconds(1_000_000_000) - 50e-6).abs() < 1e-12);
        // 50 µs > 5 × 31.25 µs? No (156.25 µs): SIMD.
        assert_eq!(s.select_backend(1_000_000, 1_000_000_000), SelectedBackend::Simd);
        // 4 GFLOP = 200 µs > 156.25 µs: GPU.
        assert_eq!(s.select_backend(1_000_000, 4_000_000_000), SelectedBackend::Gpu);
        // Either side of the boundary (3.125 GFLOP = 156.25 µs = 5 × transfer).
        assert_eq!(s.select_backend(1_000_000, 3_100_000_000), SelectedBackend::Simd);
        assert_eq!(s.select_backend(1_000_000, 3_150_000_000), SelectedBackend::Gpu);
        // Ratio 1: 50 µs > 31.25 µs.
        assert_eq!(s.with_min_dispatch_ratio(1.0).select_backend(1_000_000, 1_000_000_000), SelectedBackend::Gpu);
    }

    #[test]
    fn matmul_rule_keeps_2048_cubed_on_the_cpu() {
        let s = BackendSelector::new();
        // n³ matmul: 2n³ FLOPs, 12n² bytes: GPU iff 2n³/20e12 > 5·12n²/32e9, i.e. n > 18 750.
        assert_eq!(s.select_for_matmul(64, 64, 64), SelectedBackend::Simd);
        assert_eq!(s.select_for_matmul(1024, 1024, 1024), SelectedBackend::Simd);
        assert_eq!(s.select_for_matmul(2048, 2048, 2048), SelectedBackend::Simd);
        assert_eq!(s.select_for_matmul(18_700, 18_700, 18_700), SelectedBackend::Simd);
        assert_eq!(s.select_for_matmul(18_800, 18_800, 18_800), SelectedBackend::Gpu);
        // A faster bus and a lower ratio move the crossover: 2n³/40e12 > 3·12n²/64e9 iff n > 11 250.
        let fast = s.with_pcie_bandwidth(64e9).with_gpu_gflops(40e12).with_min_dispatch_ratio(3.0);
        assert_eq!(fast.select_for_matmul(11_200, 11_200, 11_200), SelectedBackend::Simd);
        assert_eq!(fast.select_for_matmul(11_300, 11_300, 11_300), SelectedBackend::Gpu);
    }

    #[test]
    fn element_wise_never_goes_to_the_gpu() {
        let s = BackendSelector::new();
        let add = Op::binary(compute_core::BinaryOp::Add, 1 << 26);
        assert_eq!(s.select_for_op(&add), SelectedBackend::Simd);
    }
}
