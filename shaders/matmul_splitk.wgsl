// The second pass of a split-K matmul (engine/src/kernels/matmul.rs): the first pass wrote
// each K slice's product, unscaled, as a partial [SPLITS, M, N] f32 (binding 1); this sums
// them in slice order (the same result on every run) and puts each element through the
// matmul's epilogue into C, with C's own parameters (`p.splits` slices). With VEC4 (the
// host's choice where M * N is a multiple of 4) each thread sums four neighbouring
// elements, loaded as one vec4 from each partial.
// Binding 2 is unused (the layout is the matmul's: parameters, A, B, C, bias).
{{ENABLE}}
{{MATMUL_COMMON}}
//#if VEC4
@group(0) @binding(1) var<storage, read_write> parts: array<vec4<f32>>;
//#else
@group(0) @binding(1) var<storage, read_write> parts: array<f32>;
//#endif

// Element i of C (row-major over M x N) from its sum.
fn put(i: u32, acc: f32) {
    let gm = i / p.n;
    let gn = i % p.n;
    store_c(p.c_off + gm * p.c_rs + gn, gn, acc);
}

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * 256u;
    let mn = p.m * p.n;
//#if VEC4
    let quads = mn / 4u;
    if i >= quads {
        return;
    }
    var acc = vec4<f32>(0.0);
    for (var z = 0u; z < p.splits; z++) {
        acc += parts[z * quads + i];
    }
    put(4u * i, acc.x);
    put(4u * i + 1u, acc.y);
    put(4u * i + 2u, acc.z);
    put(4u * i + 3u, acc.w);
//#else
    if i >= mn {
        return;
    }
    var acc = 0.0;
    for (var z = 0u; z < p.splits; z++) {
        acc += parts[z * mn + i];
    }
    put(i, acc);
//#endif
}
