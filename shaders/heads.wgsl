// Attention's packed input from separate projections, for grouped-query attention with
// rotary embeddings: qkv [B, T, 3, H, D] from q [B, T, H, D] and k, v [B, T, KV, D]
// (query head h reads key/value head h / (H / KV)); q and k are rotated on the way
// (transformers' rotate-half form: element d pairs with d +- D/2, angle cos/sin[t, d mod
// D/2]) when ROPE. One thread per element written.
//   MODE 0 pack:    qkv from q, k, v (src0, src1, src2 -> dst).
//   MODE 1 unpack:  one gradient from dqkv (src0 -> dst): p.part 0 dq, 1 dk, 2 dv; dk and
//                   dv summed over the query heads of their group, rotated back (the
//                   rotation's transpose: the angle negated).
// Template: ENABLE, TS (sources), TD (destination), MODE, ROPE.
{{ENABLE}}

struct Params {
    b: u32,
    t: u32,
    h: u32,
    kv: u32,
    d: u32,
    part: u32,
    n: u32,      // elements written
    _pad: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> src0: array<{{TS}}>;
@group(0) @binding(2) var<storage, read_write> src1: array<{{TS}}>;
@group(0) @binding(3) var<storage, read_write> src2: array<{{TS}}>;
@group(0) @binding(4) var<storage, read_write> dst: array<{{TD}}>;
@group(0) @binding(5) var<storage, read_write> cos_t: array<f32>;
@group(0) @binding(6) var<storage, read_write> sin_t: array<f32>;

const MODE: u32 = {{MODE}}u;
const ROPE: bool = {{ROPE}};

// Element d of the head starting at `base` in `which` source, rotated by angle sign `sg`
// at position t when `rotate`.
fn read(which: u32, i: u32) -> f32 {
    if which == 0u { return f32(src0[i]); }
    if which == 1u { return f32(src1[i]); }
    return f32(src2[i]);
}

fn rotated(which: u32, base: u32, d: u32, t: u32, rotate: bool, sg: f32) -> f32 {
    let x = read(which, base + d);
    if !ROPE || !rotate { return x; }
    let half = p.d / 2u;
    let j = d % half;
    let c = cos_t[t * half + j];
    let s = sg * sin_t[t * half + j];
    if d < half {
        return x * c - read(which, base + d + half) * s;
    }
    return x * c + read(which, base + d - half) * s;
}

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let e = gid.x + gid.y * nwg.x * 256u;
    if e >= p.n { return; }
    let d = e % p.d;
    var r = e / p.d;
    let group = p.h / p.kv;
    if MODE == 0u {
        let hh = r % p.h;
        r = r / p.h;
        let part = r % 3u;
        let bt = r / 3u;
        let t = bt % p.t;
        if part == 0u {
            dst[e] = {{TD}}(rotated(0u, (bt * p.h + hh) * p.d, d, t, true, 1.0));
        } else {
            let base = (bt * p.kv + hh / group) * p.d;
            dst[e] = {{TD}}(rotated(part, base, d, t, part == 1u, 1.0));
        }
        return;
    }
    // MODE 1: dst is [B, T, H, D] (part 0) or [B, T, KV, D] (parts 1, 2).
    let heads = select(p.kv, p.h, p.part == 0u);
    let hh = r % heads;
    let bt = r / heads;
    let t = bt % p.t;
    if p.part == 0u {
        dst[e] = {{TD}}(rotated(0u, ((bt * 3u) * p.h + hh) * p.d, d, t, true, -1.0));
        return;
    }
    var sum = 0.0;
    for (var g = 0u; g < group; g++) {
        let base = ((bt * 3u + p.part) * p.h + hh * group + g) * p.d;
        sum += rotated(0u, base, d, t, p.part == 1u, -1.0);
    }
    dst[e] = {{TD}}(sum);
}
