// What the fused attention kernels share (shaders/flash_attention.wgsl and
// shaders/flash_attention_coop.wgsl paste it at their ATTENTION_COMMON placeholder):
// the parameters and the indexing of qkv [B, T, 3C], y / dy [B, T, C] and the per-row
// [B, NH, T] vectors. The kernel declares `D4`, the head size in vec4s.

struct Params {
    b: u32,
    nh: u32,
    t: u32,
    c4: u32,        // C / 4: a row of y in vec4s
    scale: f32,
    blocks: u32,    // row blocks per (batch, head)
    per: u32,       // SIMT: keys per tile, a loop bound the compiler does not unroll
    _p1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;

// vec4 index of element (b, t, part, h, 0) of qkv.
fn qkv_at(b: u32, t: u32, part: u32, h: u32) -> u32 {
    return ((b * p.t + t) * 3u + part) * p.c4 + h * D4;
}

// vec4 index of element (b, t, h, 0) of y or dy.
fn y_at(b: u32, t: u32, h: u32) -> u32 {
    return (b * p.t + t) * p.c4 + h * D4;
}

// Index of row (b, h, t) of lse and D.
fn row_at(b: u32, h: u32, t: u32) -> u32 {
    return (b * p.nh + h) * p.t + t;
}
