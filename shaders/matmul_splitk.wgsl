// The second pass of a split-K matmul (engine/src/kernels/matmul.rs): the first pass wrote
// each K slice's product, unscaled, as a partial [SPLITS, M, N] f32 (binding 1); this sums
// them in slice order (the same result on every run) and puts each element through the
// matmul's epilogue into C, with C's own parameters (`p.splits` slices). Where the host's
// flag says (N, C's offset and row stride multiples of 4) a thread takes four neighbouring
// elements of a row: one 16-byte load from each partial and one store of four into C
// (binding 5, C's block again); otherwise one element.
// Binding 2 is unused (the layout is the matmul's: parameters, A, B, C, bias).
{{ENABLE}}
{{MATMUL_COMMON}}
@group(0) @binding(1) var<storage, read_write> parts: array<f32>;
@group(0) @binding(2) var<storage, read_write> parts4: array<vec4<f32>>;
@group(0) @binding(5) var<storage, read_write> c4: array<vec4<{{TC}}>>;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * 256u;
    let mn = p.m * p.n;
    if (p.flags & 1u) != 0u {
        let quads = mn / 4u;
        if i >= quads {
            return;
        }
        var acc = vec4<f32>(0.0);
        for (var z = 0u; z < p.splits; z++) {
            acc += parts4[z * quads + i];
        }
        let gm = 4u * i / p.n;
        let gn = 4u * i % p.n;
        let ci = (p.c_off + gm * p.c_rs + gn) / 4u;
        var old = vec4<f32>(0.0);
        if p.beta != 0.0 {
            old = vec4<f32>(c4[ci]);
        }
        let v = vec4<f32>(
            epilogue(acc.x, gn, old.x),
            epilogue(acc.y, gn + 1u, old.y),
            epilogue(acc.z, gn + 2u, old.z),
            epilogue(acc.w, gn + 3u, old.w),
        );
        c4[ci] = vec4<{{TC}}>(v);
        return;
    }
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
