// Runs the demo module (pkg/: WebGPU + CPU, built with SIMD128) and the scalar
// CPU build (pkg-scalar/), then shows the checks, a table and bar charts.
// The page's verdict is the text of #status: "PASS: …" or "FAIL: …".
import init, { run_gpu, run_cpu as run_cpu_simd } from "./pkg/web_demo.js";
import initScalar, { run_cpu as run_cpu_scalar } from "./pkg-scalar/web_demo.js";

const status = document.getElementById("status");
const fmt = (ms) => (ms >= 10 ? ms.toFixed(1) : ms.toFixed(2)) + " ms";

function setStatus(ok, text) {
  status.textContent = (ok ? "PASS: " : "FAIL: ") + text;
  status.className = ok ? "pass" : "fail";
  document.body.dataset.status = ok ? "pass" : "fail";
}

// Horizontal bars, one group per row; each group scaled to its own largest value.
function chart(groups, series, colors) {
  const barH = 14, gap = 3, groupGap = 10, labelW = 190, width = 760, valueW = 150;
  const h = groups.length * (series.length * (barH + gap) + groupGap) + 10;
  const ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("width", width);
  svg.setAttribute("height", h);
  let y = 6;
  const add = (tag, attrs, text) => {
    const e = document.createElementNS(ns, tag);
    for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
    if (text !== undefined) e.textContent = text;
    svg.appendChild(e);
  };
  for (const g of groups) {
    const max = Math.max(...series.map((s) => g.values[s] || 0), 1e-9);
    add("text", { x: 0, y: y + barH - 3 }, g.label);
    series.forEach((s, i) => {
      const v = g.values[s];
      const w = Math.max(1, ((width - labelW - valueW) * v) / max);
      add("rect", { x: labelW, y, width: w, height: barH, fill: colors[i], rx: 2 });
      add("text", { x: labelW + w + 6, y: y + barH - 3 }, `${s}: ${fmt(v)}`);
      y += barH + gap;
    });
    y += groupGap;
  }
  return svg;
}

function table(head, rows) {
  const t = document.createElement("table");
  t.innerHTML = "<tr>" + head.map((h) => `<th>${h}</th>`).join("") + "</tr>" +
    rows.map((r) => "<tr>" + r.map((c, i) => `<td class="${i === r.length - 1 && typeof c === "string" ? "text" : ""}">${c}</td>`).join("") + "</tr>").join("");
  return t;
}

async function browserAdapter() {
  if (!navigator.gpu) return "navigator.gpu is absent";
  const a = await navigator.gpu.requestAdapter();
  if (!a) return "no adapter";
  const i = a.info || {};
  return [i.vendor, i.architecture, i.device, i.description].filter(Boolean).join(" / ") || "(the browser names no adapter)";
}

async function main() {
  await init();
  await initScalar();
  // The CPU benchmark first: WebGPU on a software adapter runs on CPU threads too.
  const simd = JSON.parse(run_cpu_simd());
  const scalar = JSON.parse(run_cpu_scalar());
  const gpu = JSON.parse(await run_gpu());
  const named = await browserAdapter();
  document.getElementById("adapter").textContent = gpu.webgpu
    ? `WebGPU adapter: ${named} (wgpu: ${gpu.adapter.trim()}); CPU: ${simd.cpu}`
    : `no WebGPU adapter (${named}); engines: ${gpu.engines.join(", ")}`;

  const g = document.getElementById("gpu");
  if (gpu.webgpu) {
    g.appendChild(table(["op", "shape", "WebGPU", "CPU (SIMD128)", "max |WebGPU − CPU|", "check"],
      gpu.rows.map((r) => [r.op, r.shape, fmt(r.gpu_ms), fmt(r.cpu_ms), r.max_diff.toExponential(2), (r.ok ? "✓ " : "✗ ") + r.detail])));
    g.appendChild(chart(gpu.rows.map((r) => ({ label: `${r.op} ${r.shape}`, values: { "WebGPU": r.gpu_ms, "CPU": r.cpu_ms } })),
      ["WebGPU", "CPU"], ["#3b6fd8", "#9aa4b5"]));
  } else {
    g.textContent = "This browser offers no WebGPU adapter: only the CPU part ran.";
  }

  const c = document.getElementById("cpu");
  const byOp = Object.fromEntries(scalar.ops.map((o) => [o.op, o]));
  c.appendChild(table(["op", "shape", "SIMD128", "scalar", "speed-up"],
    simd.ops.map((o) => [o.op, o.shape, fmt(o.ms), fmt(byOp[o.op].ms), (byOp[o.op].ms / o.ms).toFixed(2) + "×"])));
  c.appendChild(chart(simd.ops.map((o) => ({ label: `${o.op} ${o.shape}`, values: { "SIMD128": o.ms, "scalar": byOp[o.op].ms } })),
    ["SIMD128", "scalar"], ["#2f9e6a", "#c7ccd6"]));
  window.demoResult = { gpu, simd, scalar, adapter: named };

  if (!gpu.webgpu) {
    setStatus(false, "no WebGPU adapter in this browser (the CPU part ran)");
  } else if (!gpu.pass) {
    setStatus(false, gpu.rows.filter((r) => !r.ok).map((r) => `${r.op}: ${r.detail}`).join("; "));
  } else if (simd.build !== "simd128" || scalar.build !== "scalar") {
    setStatus(false, `the CPU builds are ${simd.build} and ${scalar.build}, expected simd128 and scalar`);
  } else {
    setStatus(true, `${gpu.rows.length} WebGPU results match the CPU and the float64 reference; CPU ops ran in the SIMD128 and scalar builds`);
  }
}

main().catch((e) => setStatus(false, String(e && e.stack ? e.stack : e)));
