// The second pass of a split-K matmul (engine/src/kernels/matmul.rs): the first pass wrote
// each K slice's product, unscaled, as a partial [SPLITS, M, N] f32 (binding 1); this sums
// them in slice order (the same result on every run) and puts each element through the
// matmul's epilogue into C, with C's own parameters (`p.splits` slices).
// Binding 2 is unused (the layout is the matmul's: parameters, A, B, C, bias).
{{ENABLE}}
{{MATMUL_COMMON}}
@group(0) @binding(1) var<storage, read_write> parts: array<f32>;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * 256u;
    let mn = p.m * p.n;
    if i >= mn {
        return;
    }
    var acc = 0.0;
    for (var z = 0u; z < p.splits; z++) {
        acc += parts[z * mn + i];
    }
    let gm = i / p.n;
    let gn = i % p.n;
    store_c(p.c_off + gm * p.c_rs + gn, gn, acc);
}
