// Several sums over parts in one launch (engine/src/kernels/col_sums.rs): the second
// passes of split products and column sums (a split-K matmul's slices, a bias
// gradient's chunk partials, LayerNorm's weight-gradient partials), held back by the
// host and recorded together. Job j reads its parts from binding 1 + 2j and writes
// binding 2 + 2j:
//   dst[d_off + (i / n) * d_rs + i % n] = alpha * s + beta * dst[...]   (beta 0: no read)
// for i < len, s the sum over parts z < parts of src[s_off + z * s_rs + i], formed as the
// second passes it replaces form it (the same bits): LANES invocations an element, lane
// l summing parts l, l + LANES, ... in order, then the lanes added in lane order (LANES 1:
// every part in order, as a split product's sum does, with no lanes to add). A workgroup
// takes 256 / LANES elements of one job (1024 with one lane, four an invocation); job j's
// workgroups start at its `first`.
// Template: JOBS (1..), BINDINGS (two a job), SELECT (the cases naming each job's
// bindings).

struct Job {
    s_off: u32,
    s_rs: u32,
    parts: u32,
    lanes: u32,
    len: u32,
    n: u32,
    d_off: u32,
    d_rs: u32,
    alpha: f32,
    beta: f32,
    first: u32,
    _pad: u32,
}

struct Params {
    jobs: u32,
    _p0: u32,
    _p1: u32,
    _p2: u32,
    job: array<Job, {{JOBS}}>,
}

@group(0) @binding(0) var<uniform> p: Params;
{{BINDINGS}}

fn load(j: u32, i: u32) -> f32 {
    switch j {
{{LOADS}}
    }
}

fn load_dst(j: u32, i: u32) -> f32 {
    switch j {
{{LOAD_DSTS}}
    }
}

fn store(j: u32, i: u32, v: f32) {
    switch j {
{{STORES}}
    }
}

var<workgroup> lane_sums: array<f32, 256>;

// Element i's sum t through alpha and beta into job j's output.
fn finish(j: u32, job: Job, i: u32, t: f32) {
    let at = job.d_off + (i / job.n) * job.d_rs + i % job.n;
    var v = job.alpha * t;
    if job.beta != 0.0 {
        v += job.beta * load_dst(j, at);
    }
    store(j, at, v);
}

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let g = wid.x + wid.y * nwg.x;
    // The job this workgroup serves (uniform across it).
    var j = 0u;
    for (var k = 1u; k < p.jobs; k++) {
        if g >= p.job[k].first {
            j = k;
        }
    }
    let job = p.job[j];
    if job.lanes == 1u {
        // One lane: no lanes to add (t = s), four elements an invocation, 256 apart.
        for (var k = 0u; k < 4u; k++) {
            let i = (g - job.first) * 1024u + k * 256u + lid.x;
            if i < job.len {
                var s = 0.0;
                for (var z = 0u; z < job.parts; z++) {
                    s += load(j, job.s_off + z * job.s_rs + i);
                }
                finish(j, job, i, s);
            }
        }
        return;
    }
    let per = 256u / job.lanes;
    let e = lid.x % per;
    let lane = lid.x / per;
    let i = (g - job.first) * per + e;
    var s = 0.0;
    if i < job.len {
        for (var z = lane; z < job.parts; z += job.lanes) {
            s += load(j, job.s_off + z * job.s_rs + i);
        }
    }
    lane_sums[lid.x] = s;
    workgroupBarrier();
    if lane == 0u && i < job.len {
        var t = 0.0;
        for (var l = 0u; l < job.lanes; l++) {
            t += lane_sums[l * per + e];
        }
        finish(j, job, i, t);
    }
}
