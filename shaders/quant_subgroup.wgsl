// The `gemv` of quant.wgsl with its sums reduced by subgroup operations
// (adapters with wgpu's SUBGROUP feature): the backend appends this file to
// quant.wgsl (naga takes the subgroup builtins without `enable subgroups;`).
// Each sum takes one subgroupAdd; lane 0 of each subgroup stores the
// subgroup's totals (at most WG / 4 subgroups), and after one barrier the
// first MR · NR invocations add up the subgroups' partials.

@compute @workgroup_size(WG)
fn gemv_subgroup(
    @builtin(local_invocation_index) lid: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(subgroup_invocation_id) lane: u32,
    @builtin(subgroup_size) size: u32,
    @builtin(subgroup_id) sid: u32,
) {
    let group = wid.x + wid.y * nwg.x;
    if (group >= p.groups) {
        return;
    }
    let row0 = group * NR;
    accumulate(lid, row0);
    for (var a = 0u; a < MR * NR; a++) {
        let s = subgroupAdd(acc[a]);
        if (lane == 0u) {
            red[min(sid, 31u) * ACC + a] = s;
        }
    }
    workgroupBarrier();
    if (lid < MR * NR) {
        var total = 0.0;
        let count = min((WG + size - 1u) / size, 32u);
        for (var g = 0u; g < count; g++) {
            total += red[g * ACC + lid];
        }
        write_total(lid, row0, total);
    }
}
