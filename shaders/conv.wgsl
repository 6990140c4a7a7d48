// The gathers around a 2-D convolution's products (engine/src/kernels/conv.rs), on
// NHWC activations: one thread per element written.
//   MODE 0 im2col: the columns of the images n0.. [rows = n P Q, cols = G Cg R S] from
//          x [N, H, W, C]: column (g, c, r, s) of row (n, p, q) is
//          x[n, p sh + r dh - ph, q sw + s dw - pw, g Cg + c], zero outside the image
//          (the weight [K, Cg, R, S] read as a matrix has the same column order).
//   MODE 1 col2im: dx [n, H, W, C] from the columns' gradient: each input element sums
//          the columns that read it (a gather: no atomics, the same order every run).
// Template: ENABLE, TS (source), TD (destination), MODE.
{{ENABLE}}

struct Params {
    n: u32, h: u32, w: u32, c: u32,
    p: u32, q: u32, r: u32, s: u32,
    sh: u32, sw: u32, ph: u32, pw: u32,
    dh: u32, dw: u32, groups: u32, total: u32,
    src_off: u32, dst_off: u32, _a: u32, _b: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> src: array<{{TS}}>;
@group(0) @binding(2) var<storage, read_write> dst: array<{{TD}}>;

const MODE: u32 = {{MODE}}u;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let e = gid.x + gid.y * nwg.x * 256u;
    if e >= p.total { return; }
    let cg = p.c / p.groups;
    let rs = p.r * p.s;
    let per_group = cg * rs;
    let cols = p.groups * per_group;
    if MODE == 0u {
        let row = e / cols;
        let col = e % cols;
        let g = col / per_group;
        let ci = (col % per_group) / rs;
        let r = (col % rs) / p.s;
        let s = col % p.s;
        let q = row % p.q;
        let pp = (row / p.q) % p.p;
        let n = row / (p.p * p.q);
        let hh = i32(pp * p.sh + r * p.dh) - i32(p.ph);
        let ww = i32(q * p.sw + s * p.dw) - i32(p.pw);
        var v = 0.0;
        if hh >= 0 && hh < i32(p.h) && ww >= 0 && ww < i32(p.w) {
            v = f32(src[p.src_off + ((n * p.h + u32(hh)) * p.w + u32(ww)) * p.c + g * cg + ci]);
        }
        dst[p.dst_off + e] = {{TD}}(v);
    } else {
        let ch = e % p.c;
        let x = (e / p.c) % p.w;
        let y = (e / (p.c * p.w)) % p.h;
        let n = e / (p.c * p.w * p.h);
        let g = ch / cg;
        let col0 = g * per_group + (ch % cg) * rs;
        var acc = 0.0;
        for (var r = 0u; r < p.r; r++) {
            let ty = i32(y + p.ph) - i32(r * p.dh);
            if ty < 0 || u32(ty) % p.sh != 0u { continue; }
            let pp = u32(ty) / p.sh;
            if pp >= p.p { continue; }
            for (var s = 0u; s < p.s; s++) {
                let tx = i32(x + p.pw) - i32(s * p.dw);
                if tx < 0 || u32(tx) % p.sw != 0u { continue; }
                let q = u32(tx) / p.sw;
                if q >= p.q { continue; }
                acc += f32(src[p.src_off + ((n * p.p + pp) * p.q + q) * cols + col0 + r * p.s + s]);
            }
        }
        dst[p.dst_off + e] = {{TD}}(acc);
    }
}
