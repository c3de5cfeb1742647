//! Is a slow one-thread call on freshly allocated buffers explained by the
//! physical pages those buffers got? For element-wise add at 2¹⁶ and 2¹⁷
//! elements, each trial allocates three buffers (kept alive, so each trial
//! gets new pages), times the one-thread engine (median of 400 calls after
//! 200 untimed ones) and reads the buffers' physical frames from
//! `/proc/self/pagemap` (frame numbers need root). Per trial it prints the
//! median, the most pages that share one L2 page colour (frames with the same
//! set-index bits above the page offset: they compete for the same sets), the
//! L2's ways, how many pages are not physically contiguous with the page
//! before, and how many sit in transparent huge pages (`/proc/kpageflags`).
//! Two layouts: three plain `Vec`s, and three `Vec`s each starting on a page.
//!
//! ```text
//! cargo run --release -p dispatch --example page_colors
//! ```

use std::io::{Read, Seek, SeekFrom};
use std::time::Instant;

use compute_core::{BinaryOp, ComputeError, Op};
use dispatch::Engine;

const PAGE: usize = 4096;
const TRIALS: usize = 40;

fn main() -> Result<(), ComputeError> {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default().trim().to_string();
    let l2 = "/sys/devices/system/cpu/cpu0/cache/index2";
    let sets: usize = read(&format!("{l2}/number_of_sets")).parse().unwrap_or(2048);
    let ways: usize = read(&format!("{l2}/ways_of_associativity")).parse().unwrap_or(16);
    let line: usize = read(&format!("{l2}/coherency_line_size")).parse().unwrap_or(64);
    let colours = (sets * line / PAGE).max(1);
    println!("L2 {} ({sets} sets x {ways} ways, {colours} page colours)", read(&format!("{l2}/size")));
    println!("transparent huge pages: {}", read("/sys/kernel/mm/transparent_hugepage/enabled"));
    let Some(one) = dispatch::discover::cpu().into_iter().find(|(e, _)| *e == Engine::SimdSingle).map(|(_, b)| b)
    else {
        println!("needs the one-thread CPU engine");
        return Ok(());
    };
    println!("layout  n      trial  median_us  max_pages_per_colour  breaks  thp_pages  pages");
    for p in [16u32, 17] {
        let n = 1usize << p;
        let op = Op::binary(BinaryOp::Add, n);
        for aligned in [false, true] {
            let mut keep = Vec::new();
            for t in 0..TRIALS {
                let fill = |i: usize| -> Vec<f32> {
                    let len = if aligned { n + PAGE / 4 } else { n };
                    (0..len).map(|j| ((j * 7919 + i + t) % 1000) as f32 / 1000.0 - 0.5).collect()
                };
                let mut bufs: Vec<(Vec<f32>, usize)> = (0..3)
                    .map(|i| {
                        let v = fill(i);
                        let at =
                            if aligned { (PAGE / 4 - (v.as_ptr() as usize / 4) % (PAGE / 4)) % (PAGE / 4) } else { 0 };
                        (v, at)
                    })
                    .collect();
                let [(a, x), (b, y), (o, z)] = &mut bufs[..] else { unreachable!() };
                let (a, b, out) = (&a[*x..*x + n], &b[*y..*y + n], &mut o[*z..*z + n]);
                for _ in 0..200 {
                    one.run(&op, &[a, b], out)?;
                }
                let mut samples = Vec::with_capacity(400);
                for _ in 0..400 {
                    let s = Instant::now();
                    one.run(&op, &[a, b], out)?;
                    samples.push(s.elapsed().as_secs_f64());
                }
                samples.sort_by(f64::total_cmp);
                let frames: Vec<u64> = [a.as_ptr(), b.as_ptr(), out.as_ptr()]
                    .into_iter()
                    .flat_map(|ptr| frames_of(ptr as usize, n * 4).unwrap_or_default())
                    .collect();
                let mut per_colour = vec![0usize; colours];
                for f in &frames {
                    per_colour[(*f as usize) % colours] += 1;
                }
                let breaks = frames.windows(2).filter(|w| w[1] != w[0] + 1).count();
                let mut flags = std::fs::File::open("/proc/kpageflags").ok();
                let thp = frames.iter().filter(|&&f| is_thp(flags.as_mut(), f)).count();
                println!(
                    "{:<7} 2^{p:<4} {t:>5}  {:>9.2}  {:>20}  {breaks:>6}  {thp:>9}  {}",
                    if aligned { "page" } else { "plain" },
                    samples[samples.len() / 2] * 1e6,
                    per_colour.iter().max().copied().unwrap_or(0),
                    frames.len()
                );
                keep.extend(bufs.into_iter().map(|(v, _)| v));
            }
        }
    }
    Ok(())
}

/// Physical frame numbers of the pages holding `bytes` bytes from `addr`
/// (zeros without root); `None` where pagemap cannot be read.
fn frames_of(addr: usize, bytes: usize) -> Option<Vec<u64>> {
    let (first, last) = (addr / PAGE, (addr + bytes - 1) / PAGE);
    let mut f = std::fs::File::open("/proc/self/pagemap").ok()?;
    f.seek(SeekFrom::Start(first as u64 * 8)).ok()?;
    let mut raw = vec![0u8; (last - first + 1) * 8];
    f.read_exact(&mut raw).ok()?;
    Some(
        raw.chunks_exact(8)
            .map(|c| u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]) & ((1 << 55) - 1))
            .collect(),
    )
}

/// Whether frame `pfn` is part of a transparent huge page (bit 22 of its
/// entry in `flags`, the open `/proc/kpageflags`; false without it).
fn is_thp(flags: Option<&mut std::fs::File>, pfn: u64) -> bool {
    let Some(f) = flags else { return false };
    let mut raw = [0u8; 8];
    f.seek(SeekFrom::Start(pfn * 8)).is_ok()
        && f.read_exact(&mut raw).is_ok()
        && u64::from_le_bytes(raw) & (1 << 22) != 0
}
