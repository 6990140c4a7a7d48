// Tree reductions over a workgroup of WG invocations (WG a power of two, declared by the
// kernel that pastes this snippet in). The pairwise order is fixed, so
// results are bitwise repeatable. Every invocation of the workgroup must make each call:
// they are barrier points, and the result is read by all before the scratch is reused.
var<workgroup> red: array<f32, WG>;
var<workgroup> red2: array<f32, WG>;

fn workgroup_sum(lid: u32, v: f32) -> f32 {
    red[lid] = v;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if lid < s { red[lid] = red[lid] + red[lid + s]; }
        workgroupBarrier();
    }
    let r = red[0];
    workgroupBarrier();
    return r;
}

fn workgroup_max(lid: u32, v: f32) -> f32 {
    red[lid] = v;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if lid < s { red[lid] = max(red[lid], red[lid + s]); }
        workgroupBarrier();
    }
    let r = red[0];
    workgroupBarrier();
    return r;
}

// Two sums at once (LayerNorm's mean and mean of squares): one set of barriers.
fn workgroup_sum2(lid: u32, a: f32, b: f32) -> vec2<f32> {
    red[lid] = a;
    red2[lid] = b;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if lid < s {
            red[lid] = red[lid] + red[lid + s];
            red2[lid] = red2[lid] + red2[lid + s];
        }
        workgroupBarrier();
    }
    let r = vec2<f32>(red[0], red2[0]);
    workgroupBarrier();
    return r;
}
