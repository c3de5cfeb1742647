//! Builder unit tests: what the emitted text looks like, and every structural
//! misuse reported by `finish`.

use super::*;

fn kernel(f: impl FnOnce(&mut KernelBuilder)) -> Result<Kernel, BuildError> {
    let mut b = KernelBuilder::new("k", Target::Sm90);
    f(&mut b);
    b.finish()
}

fn body(k: &Kernel) -> Vec<&str> {
    k.ptx().lines().map(str::trim).collect()
}

#[test]
fn header_declares_version_target_and_registers() {
    let k = kernel(|b| {
        let x = b.param_ptr("x");
        let n = b.param::<U32>("n");
        let v = b.ld_global::<F32>(x, 8);
        let w = b.add(v, 1.5f32);
        let p = b.setp(Cmp::Lt, n, 7u32);
        let s = b.selp(w, v, p);
        b.st_global(x, -4, s);
        b.ret();
    })
    .unwrap();
    let t = k.ptx();
    assert!(t.contains(".version 8.0\n.target sm_90\n.address_size 64"));
    assert!(t.contains(".param .u64 k_x,\n\t.param .u32 k_n\n)"));
    assert!(t.contains(".reg .pred %p<1>;"));
    assert!(t.contains(".reg .f32 %f<3>;"));
    let lines = body(&k);
    assert!(lines.contains(&"ld.global.f32 %f0, [%rd1+8];"), "{t}");
    assert!(lines.contains(&"add.rn.f32 %f1, %f0, 0f3FC00000;"), "{t}");
    assert!(lines.contains(&"setp.lt.u32 %p0, %r0, 7;"));
    assert!(lines.contains(&"selp.f32 %f2, %f1, %f0, %p0;"));
    assert!(lines.contains(&"st.global.f32 [%rd1-4], %f2;"));
    assert_eq!(k.params(), &[ParamTy::Scalar(Ty::U64), ParamTy::Scalar(Ty::U32)]);
}

#[test]
fn hopper_kernels_wait_for_the_kernel_before_them_first() {
    for target in [Target::Sm80, Target::Sm90, Target::Sm90a] {
        let mut b = KernelBuilder::new("k", target);
        let x = b.param_ptr("x");
        let v = b.ld_global::<F32>(x, 0);
        b.st_global(x, 4, v);
        b.ret();
        let k = b.finish().unwrap();
        let lines: Vec<&str> = body(&k).into_iter().filter(|l| !l.is_empty() && !l.starts_with('.')).collect();
        let first_inst = lines.iter().position(|l| l.ends_with(';') && !l.starts_with("//")).unwrap();
        let waits = target >= Target::Sm90;
        assert_eq!(k.waits_for_prerequisites(), waits, "{target}");
        if waits {
            // Before any load: the kernel ahead may still be writing `x`.
            assert_eq!(
                &lines[first_inst..first_inst + 2],
                &["griddepcontrol.launch_dependents;", "griddepcontrol.wait;"],
                "{target}"
            );
        } else {
            assert!(!k.ptx().contains("griddepcontrol"), "{target}");
        }
    }
}

#[test]
fn a_kernel_may_prefetch_before_it_waits() {
    let k = kernel(|b| {
        let x = b.param_ptr("x");
        b.prefetch_l2(x, 256);
        b.wait_for_prerequisites();
        let v = b.ld_global::<F32>(x, 0);
        b.st_global(x, 4, v);
        b.ret();
    })
    .unwrap();
    let t = k.ptx();
    assert_eq!(t.matches("griddepcontrol.wait;").count(), 1, "{t}");
    let at = |s: &str| t.find(s).unwrap();
    assert!(at("griddepcontrol.launch_dependents;") < at("prefetch.global.L2 [%rd1+256];"), "{t}");
    assert!(at("prefetch.global.L2") < at("griddepcontrol.wait;"), "{t}");
    assert!(at("griddepcontrol.wait;") < at("ld.global.f32"), "{t}");

    let twice = kernel(|b| {
        b.wait_for_prerequisites();
        b.wait_for_prerequisites();
        b.ret();
    });
    assert!(twice.unwrap_err().problems.iter().any(|p| p.contains("twice")));
}

#[test]
fn float_immediates_are_exact_hex() {
    let k = kernel(|b| {
        let a = b.mov(0.1f32);
        let c = b.mul(a, -0.0f32);
        let _ = b.add(c, f32::NEG_INFINITY);
        b.ret();
    })
    .unwrap();
    let t = k.ptx();
    assert!(t.contains(&format!("0f{:08X}", 0.1f32.to_bits())));
    assert!(t.contains("0f80000000"), "-0.0 keeps its sign");
    assert!(t.contains("0fFF800000"));
}

#[test]
fn vector_memory_and_shared_arrays() {
    let k = kernel(|b| {
        let x = b.param_ptr("x");
        let s = b.shared("tile", 1024, 16);
        let base = b.shared_base(&s);
        let v = b.ld_global_nc_v::<F32, 4>(x, 16);
        b.st_shared_v::<F32, 4>(base, 32, v.map(Src::from));
        b.bar_sync();
        let w = b.ld_shared_v::<F32, 2>(base, 0);
        b.st_global_v::<F32, 2>(x, 0, w.map(Src::from));
        b.ret();
    })
    .unwrap();
    let t = k.ptx();
    assert!(t.contains(".shared .align 16 .b8 k_tile[1024];"));
    assert!(t.contains("mov.u32 %r0, k_tile;"));
    assert!(t.contains("ld.global.nc.v4.f32 {%f0, %f1, %f2, %f3}, [%rd1+16];"), "{t}");
    assert!(t.contains("st.shared.v4.f32 [%r0+32], {%f0, %f1, %f2, %f3};"));
    assert!(t.contains("ld.shared.v2.f32 {%f4, %f5}, [%r0];"));
}

#[test]
fn wide_vectors_are_rejected() {
    let e = kernel(|b| {
        let x = b.param_ptr("x");
        let _ = b.ld_global_v::<F64, 4>(x, 0);
        let _ = b.ld_global_v::<F32, 3>(x, 0);
        b.ret();
    })
    .unwrap_err();
    assert_eq!(e.problems.len(), 2, "{e}");
    assert!(e.problems[0].contains("32 bytes"), "{e}");
}

#[test]
fn labels_loops_and_guards() {
    let k = kernel(|b| {
        let n = b.param::<U32>("n");
        let i = b.mov(0u32);
        let top = b.label("loop");
        let end = b.label("end");
        b.place(top);
        let done = b.setp(Cmp::Ge, i, n);
        b.bra_if(done, end);
        let next = b.add(i, 1u32);
        b.assign(i, next);
        b.bra(top);
        b.place(end);
        b.guarded(done, true, |b| b.bar_sync());
        b.ret();
    })
    .unwrap();
    let lines = body(&k);
    assert!(lines.contains(&"$L0_loop:"));
    assert!(lines.contains(&"@%p0 bra $L1_end;"));
    assert!(lines.contains(&"bra $L0_loop;"));
    assert!(lines.contains(&"mov.u32 %r1, %r2;"), "{}", k.ptx());
    assert!(lines.contains(&"@!%p0 bar.sync 0;"));
}

#[test]
fn label_misuse_is_reported() {
    let e = kernel(|b| {
        let l = b.label("never_placed");
        b.bra(l);
        let twice = b.label("twice");
        b.place(twice);
        b.place(twice);
        b.ret();
    })
    .unwrap_err();
    let all = e.problems.join("\n");
    assert!(all.contains("placed twice"), "{all}");
    assert!(all.contains("never placed"), "{all}");
}

#[test]
fn foreign_registers_and_labels_are_reported() {
    let mut other = KernelBuilder::new("other", Target::Sm80);
    let r = other.mov(1.0f32);
    let l = other.label("x");
    let e = kernel(|b| {
        let _ = b.add(r, 2.0f32);
        b.bra(l);
        b.ret();
    })
    .unwrap_err();
    let all = e.problems.join("\n");
    assert!(all.contains("belongs to another kernel"), "{all}");
    assert!(all.contains("label"), "{all}");
}

#[test]
fn names_params_and_comments_are_validated() {
    let e = KernelBuilder::new("9bad", Target::Sm90).finish().unwrap_err();
    assert!(e.to_string().contains("not a valid PTX identifier"));
    let e = kernel(|b| {
        let _ = b.param::<U32>("n");
        let _ = b.param::<U32>("n");
        b.comment("naïve");
        b.ret();
    })
    .unwrap_err();
    let all = e.problems.join("\n");
    assert!(all.contains("declared twice"), "{all}");
    assert!(all.contains("ASCII"), "{all}");
}

#[test]
fn unordered_comparisons_need_floats() {
    let e = kernel(|b| {
        let a = b.mov(1u32);
        let _ = b.setp(Cmp::Neu, a, 2u32);
        b.ret();
    })
    .unwrap_err();
    assert!(e.problems[0].contains("float"));
}

#[test]
fn conversions_carry_their_rounding() {
    let k = kernel(|b| {
        let u = b.mov(3u32);
        let f = b.cvt::<F32, U32>(u);
        let back = b.cvt::<U32, F32>(f);
        let _wide = b.cvt::<U64, U32>(back);
        let _r = b.round_even(f);
        b.ret();
    })
    .unwrap();
    let t = k.ptx();
    assert!(t.contains("cvt.rn.f32.u32"));
    assert!(t.contains("cvt.rzi.u32.f32"));
    assert!(t.contains("cvt.u64.u32"));
    assert!(t.contains("cvt.rni.f32.f32"));
}

#[test]
fn warp_shuffles_and_specials() {
    let k = kernel(|b| {
        let v = b.mov(1.0f32);
        let _ = b.shfl_bfly(v, 16);
        let _ = b.shfl_down(v, 1);
        let lane = b.laneid();
        let _ = b.shfl_idx(v, lane);
        let _ = b.tid(Dim::Y);
        let _ = b.nctaid(Dim::Z);
        b.ret();
    })
    .unwrap();
    let t = k.ptx();
    assert!(t.contains("shfl.sync.bfly.b32 %f1, %f0, 16, 31, 0xffffffff;"), "{t}");
    assert!(t.contains("shfl.sync.down.b32"));
    assert!(t.contains("shfl.sync.idx.b32 %f3, %f0, %r0, 31, 0xffffffff;"));
    assert!(t.contains("mov.u32 %r1, %tid.y;"));
    assert!(t.contains("%nctaid.z"));
}

#[test]
fn async_copies_and_tensor_core_instructions() {
    let k = kernel(|b| {
        let x = b.param_ptr("x");
        let s = b.shared("buf", 256, 128);
        let base = b.shared_base(&s);
        b.cp_async_16(base, 0, x, 0, None);
        let n = b.mov(8u32);
        b.cp_async_16(base, 16, x, 16, Some(n.into()));
        b.cp_async_commit();
        b.cp_async_wait(0);
        b.bar_sync();
        let a = b.ldmatrix_x4(base, 0, false);
        let at = b.ldmatrix_x4(base, 64, true);
        let bb = [a[0], a[1]];
        let c = [b.mov(0.0f32), b.mov(0.0f32), b.mov(0.0f32), b.mov(0.0f32)];
        let d = b.mma_m16n8k16(Half::Bf16, a, bb, c);
        b.mma_m16n8k16_acc(Half::F16, d, at, bb);
        b.st_global_v::<F32, 4>(x, 0, d.map(Src::from));
        b.ret();
    })
    .unwrap();
    let t = k.ptx();
    assert!(t.contains("cp.async.cg.shared.global [%r0], [%rd1], 16;"), "{t}");
    assert!(t.contains("cp.async.cg.shared.global [%r0+16], [%rd1+16], 16, %r1;"));
    assert!(t.contains("cp.async.wait_group 0;"));
    assert!(t.contains("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%r2, %r3, %r4, %r5}, [%r0];"));
    assert!(t.contains("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%f4, %f5, %f6, %f7}, {%r2, %r3, %r4, %r5}, {%r2, %r3}, {%f0, %f1, %f2, %f3};"), "{t}");
    assert!(t.contains("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%r6, %r7, %r8, %r9}, [%r0+64];"), "{t}");
    assert!(t.contains("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%f4, %f5, %f6, %f7}, {%r6, %r7, %r8, %r9}, {%r2, %r3}, {%f4, %f5, %f6, %f7};"), "{t}");
}

#[test]
fn guards_do_not_nest_and_labels_stay_outside() {
    let e = kernel(|b| {
        let five = b_u32(b);
        let p = b.setp(Cmp::Eq, five, 0u32);
        let l = b.label("l");
        b.guarded(p, false, |b| {
            b.guarded(p, true, |b| b.bar_sync());
            b.place(l);
        });
        b.ret();
    })
    .unwrap_err();
    let all = e.problems.join("\n");
    assert!(all.contains("do not nest"), "{all}");
    assert!(all.contains("cannot be placed inside a guarded block"), "{all}");
}

fn b_u32(b: &mut KernelBuilder) -> Reg<U32> {
    b.mov(5u32)
}

#[test]
fn targets_map_compute_capabilities() {
    assert_eq!(Target::for_compute_capability(9, 0), Some(Target::Sm90));
    assert_eq!(Target::for_compute_capability(10, 0), Some(Target::Sm90));
    assert_eq!(Target::for_compute_capability(8, 6), Some(Target::Sm80));
    assert_eq!(Target::for_compute_capability(7, 5), None);
}

#[test]
fn register_a_wgmma_and_named_barriers() {
    let build = |target: Target, bad: bool| {
        let mut b = KernelBuilder::new("k", target);
        let acc: Vec<Reg<F32>> = (0..4).map(|_| b.mov(0.0f32)).collect();
        let a = [(); 4].map(|_| b.mov(0u32));
        let desc = b.mov(0u64);
        let on = b.setp(Cmp::Eq, a[0], 0u32);
        b.wgmma_mma_async_reg_a(WgmmaInput::Half(Half::Bf16), &acc, a, desc, on, true);
        let id = b.mov(3u32);
        b.barrier_sync(1u32, 256);
        b.barrier_arrive(id, 128);
        if bad {
            b.barrier_sync(16u32, 256);
            b.barrier_arrive(2u32, 100);
        }
        b.ret();
        b.finish()
    };
    let k = build(Target::Sm90a, false).unwrap();
    let t = k.ptx();
    assert!(
        t.contains("wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {%f0, %f1, %f2, %f3}, {%r0, %r1, %r2, %r3}, %rd0, %p0, 1, 1, 1;"),
        "{t}"
    );
    assert!(t.contains("barrier.sync 1, 256;"), "{t}");
    assert!(t.contains("barrier.arrive %r4, 128;"), "{t}");
    let e = build(Target::Sm90a, true).unwrap_err();
    let all = e.problems.join("\n");
    assert!(all.contains("id 16 is not an integer in 0..16"), "{all}");
    assert!(all.contains("100 threads"), "{all}");
    let e = build(Target::Sm90, false).unwrap_err();
    assert!(e.problems.join("\n").contains("sm_90a"), "{e}");
    // TF32 from registers: k 8, no transpose flag; a transposed B is refused.
    let tf32 = |mn_major_b: bool| {
        let mut b = KernelBuilder::new("k", Target::Sm90a);
        let acc: Vec<Reg<F32>> = (0..4).map(|_| b.mov(0.0f32)).collect();
        let a = [(); 4].map(|_| b.mov(0u32));
        let desc = b.mov(0u64);
        let on = b.setp(Cmp::Eq, a[0], 0u32);
        b.wgmma_mma_async_reg_a(WgmmaInput::Tf32, &acc, a, desc, on, mn_major_b);
        b.ret();
        b.finish()
    };
    let kernel = tf32(false).unwrap();
    let t = kernel.ptx();
    assert!(
        t.contains("wgmma.mma_async.sync.aligned.m64n8k8.f32.tf32.tf32 {%f0, %f1, %f2, %f3}, {%r0, %r1, %r2, %r3}, %rd0, %p0, 1, 1;"),
        "{t}"
    );
    assert!(tf32(true).unwrap_err().problems.join("\n").contains("k-contiguous B only"));
}
