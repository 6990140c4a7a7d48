// The gathers around a 2-D convolution's products (engine/src/kernels/conv.rs), on
// NHWC activations, one thread per W elements written (W = 4 where a group's channels
// are a multiple of 4: vec4 loads and stores along the channels).
//   MODE 0 im2col: the columns of images [rows = n P Q, cols = G LD] from x [N, H, W, C]
//          (a thread writes one vector of RB consecutive rows, a vector of W columns
//          each):
//          column j = (r S + s) Cg + c of group g (g LD + j) of row (n, p, q) is
//          x[n, p sh + r dh - ph, q sw + s dw - pw, g Cg + c], zero outside the image
//          and in the pad columns j >= Cg R S (LD rounds a group's width up so that
//          the products load aligned rows). Consecutive threads read consecutive
//          channels of one pixel.
//   MODE 1 col2im: dx [n, H, W, C] from the columns' gradient: each input element sums
//          the columns that read it (a gather: no atomics, the same order every run).
//   MODE 2 pack: the weight [K, Cg, R, S] as the products read it: [K, LD] in (r, s, c)
//          order, zero in the pad columns (dst), from src in any float type.
//   MODE 3 unpack: the weight gradient [K, Cg, R, S] (dst) from the products' [K, LD].
// Template: ENABLE, TS (source), TD (destination), MODE, W (1 or 4), VS and VD (the
// element types as stored: TS / TD, or vec4 of them), VA (f32 or vec4<f32>: col2im
// sums in f32 whatever it reads and writes), SPLIT (im2col only: W = 4 columns
// written, each read on its own, for channels not in fours).
{{ENABLE}}

struct Params {
    n: u32, h: u32, w: u32, c: u32,
    p: u32, q: u32, r: u32, s: u32,
    sh: u32, sw: u32, ph: u32, pw: u32,
    dh: u32, dw: u32, groups: u32, total: u32,
    src_off: u32, dst_off: u32, ld: u32, k: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> src: array<{{VS}}>;
@group(0) @binding(2) var<storage, read_write> dst: array<{{VD}}>;

const MODE: u32 = {{MODE}}u;
const W: u32 = {{W}}u;
const RB: u32 = 8u;   // rows a thread of MODE 0 writes

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let t = gid.x + gid.y * nwg.x * 256u;
    if t >= p.total { return; }
    let e = t * W;               // modes 1-3: the first element this thread writes
    let cg = p.c / p.groups;
    let rs = p.r * p.s;
    let per = cg * rs;
    let cols = p.groups * p.ld;
    if MODE == 0u {
        // Thread t writes vector v of RB consecutive rows from row0: its column's tap
        // and channel are worked out once, the rows' pixels by stepping along q (integer
        // division per element made this pass ALU-bound on the H100).
        let v = t % (cols / W);
        let row0 = (t / (cols / W)) * RB;
        let col = v * W;
        let g = col / p.ld;
        let j = col % p.ld;
        let ci = j % cg;
        let rr = (j / cg) / p.s;
        let ss = (j / cg) % p.s;
        let rows = p.n * p.p * p.q;
        var q = row0 % p.q;
        var pp = (row0 / p.q) % p.p;
        var n = row0 / (p.p * p.q);
        let live = j < per;
        let dy = i32(rr * p.dh) - i32(p.ph);
        let dx = i32(ss * p.dw) - i32(p.pw);
//#if SPLIT
        // Few channels (the stem's 3): the 4 columns of the vector written are each
        // their own tap and channel, read one element at a time.
        var lv: array<bool, 4>;
        var oy: array<i32, 4>;
        var ox: array<i32, 4>;
        var ch: array<u32, 4>;
        for (var l = 0u; l < 4u; l++) {
            let jl = j + l;
            let tap = jl / cg;
            lv[l] = jl < per;
            oy[l] = i32((tap / p.s) * p.dh) - i32(p.ph);
            ox[l] = i32((tap % p.s) * p.dw) - i32(p.pw);
            ch[l] = g * cg + jl % cg;
        }
        for (var i = 0u; i < RB; i++) {
            let row = row0 + i;
            if row >= rows { break; }
            var v = array<{{TD}}, 4>();
            for (var l = 0u; l < 4u; l++) {
                let hh = i32(pp * p.sh) + oy[l];
                let ww = i32(q * p.sw) + ox[l];
                if lv[l] && hh >= 0 && hh < i32(p.h) && ww >= 0 && ww < i32(p.w) {
                    v[l] = {{TD}}(src[p.src_off + ((n * p.h + u32(hh)) * p.w + u32(ww)) * p.c + ch[l]]);
                }
            }
            dst[(p.dst_off + row * cols + col) / W] = {{VD}}(v[0], v[1], v[2], v[3]);
            q += 1u;
            if q == p.q {
                q = 0u;
                pp += 1u;
                if pp == p.p {
                    pp = 0u;
                    n += 1u;
                }
            }
        }
//#else
        for (var i = 0u; i < RB; i++) {
            let row = row0 + i;
            if row >= rows { break; }
            let hh = i32(pp * p.sh) + dy;
            let ww = i32(q * p.sw) + dx;
            var x = {{VD}}();
            if live && hh >= 0 && hh < i32(p.h) && ww >= 0 && ww < i32(p.w) {
                x = {{VD}}(src[(p.src_off + ((n * p.h + u32(hh)) * p.w + u32(ww)) * p.c + g * cg + ci) / W]);
            }
            dst[(p.dst_off + row * cols + col) / W] = x;
            q += 1u;
            if q == p.q {
                q = 0u;
                pp += 1u;
                if pp == p.p {
                    pp = 0u;
                    n += 1u;
                }
            }
        }
//#endif
    }
//#if SPLIT
//#else
    else if MODE == 1u {
        let ch = e % p.c;
        let x = (e / p.c) % p.w;
        let y = (e / (p.c * p.w)) % p.h;
        let n = e / (p.c * p.w * p.h);
        let g = ch / cg;
        let col0 = g * p.ld + ch % cg;
        var acc = {{VA}}();
        for (var r = 0u; r < p.r; r++) {
            let ty = i32(y + p.ph) - i32(r * p.dh);
            if ty < 0 { continue; }
            // Stride 1 (most layers) needs no division.
            var pp = u32(ty);
            if p.sh != 1u {
                if pp % p.sh != 0u { continue; }
                pp /= p.sh;
            }
            if pp >= p.p { continue; }
            for (var s = 0u; s < p.s; s++) {
                let tx = i32(x + p.pw) - i32(s * p.dw);
                if tx < 0 { continue; }
                var q = u32(tx);
                if p.sw != 1u {
                    if q % p.sw != 0u { continue; }
                    q /= p.sw;
                }
                if q >= p.q { continue; }
                acc += {{VA}}(src[(p.src_off + ((n * p.p + pp) * p.q + q) * cols + col0 + (r * p.s + s) * cg) / W]);
            }
        }
        dst[(p.dst_off + e) / W] = {{VD}}(acc);
    } else if MODE == 2u {
        // W is 1 here: one weight element a thread.
        let k = e / p.ld;
        let j = e % p.ld;
        var v = {{VD}}();
        if j < per {
            let ci = j % cg;
            let rr = (j / cg) / p.s;
            let ss = (j / cg) % p.s;
            v = {{VD}}(src[p.src_off + ((k * cg + ci) * p.r + rr) * p.s + ss]);
        }
        dst[p.dst_off + e] = v;
    } else {
        let k = e / per;
        let i = e % per;
        let ci = i / rs;
        let rr = (i % rs) / p.s;
        let ss = i % p.s;
        dst[p.dst_off + e] = {{VD}}(src[p.src_off + k * p.ld + (rr * p.s + ss) * cg + ci]);
    }
//#endif
}
