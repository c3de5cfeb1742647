//! A dependency-free SVG bar chart of the ratio column (ours vs peer; 1.0 = parity).

use crate::report::Record;

fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

/// Renders one horizontal bar per row that has a ratio; bars right of the 1.0
/// line mean we beat the peer (for sgemm: faster; for memory-bound rows: closer
/// to the bandwidth baseline than 1.0 means slower than the baseline).
pub fn render(title: &str, rows: &[Record]) -> String {
    let rows: Vec<&Record> = rows.iter().filter(|r| r.ratio.is_some_and(f64::is_finite)).collect();
    let bar_h = 18.0;
    let label_w = 420.0;
    let plot_w = 520.0;
    let top = 50.0;
    let height = top + bar_h * rows.len() as f64 + 40.0;
    let max_ratio = rows.iter().filter_map(|r| r.ratio).fold(1.5f64, f64::max).min(20.0);
    let x = |v: f64| label_w + plot_w * (v.min(max_ratio) / max_ratio);
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{height}\" font-family=\"monospace\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"10\" y=\"22\" font-size=\"15\">{t}</text>\n\
         <text x=\"10\" y=\"40\" fill=\"#555\">ratio = peer time / our time (sgemm), or our GB/s / baseline GB/s (memory-bound rows)</text>\n",
        w = label_w + plot_w + 80.0,
        t = esc(title),
    );
    for (i, r) in rows.iter().enumerate() {
        let y = top + bar_h * i as f64;
        let ratio = r.ratio.unwrap_or(0.0);
        let color = if ratio >= 1.0 {
            "#2a7"
        } else if ratio >= 0.9 {
            "#db3"
        } else {
            "#d54"
        };
        let label =
            format!("{} {} {} t={} vs {}", r.op, r.shape, r.backend, r.threads, r.peer.as_deref().unwrap_or("-"));
        s += &format!(
            "<text x=\"{lx}\" y=\"{ty}\" text-anchor=\"end\">{label}</text>\
             <rect x=\"{x0}\" y=\"{ry}\" width=\"{bw:.1}\" height=\"{bh}\" fill=\"{color}\"/>\
             <text x=\"{tx:.1}\" y=\"{ty}\">{ratio:.2}</text>\n",
            lx = label_w - 6.0,
            ty = y + 13.0,
            label = esc(&label),
            x0 = label_w,
            ry = y + 2.0,
            bw = x(ratio) - label_w,
            bh = bar_h - 4.0,
            tx = x(ratio) + 4.0,
        );
    }
    let one = x(1.0);
    s += &format!(
        "<line x1=\"{one:.1}\" y1=\"{top}\" x2=\"{one:.1}\" y2=\"{b}\" stroke=\"black\" stroke-dasharray=\"4 3\"/>\
         <text x=\"{one:.1}\" y=\"{tb}\" text-anchor=\"middle\">1.0</text>\n</svg>\n",
        b = height - 30.0,
        tb = height - 15.0,
    );
    s
}
