// 2-D pooling on NHWC activations (engine/src/kernels/pool.rs), one thread per element
// written, as PyTorch computes it:
//   MODE 0 max forward: y[n, p, q, c] = the window's largest (NaN wins; padding never).
//   MODE 1 max backward: dx[n, h, w, c] sums dy over the windows whose first largest
//          element is (h, w), each window's argmax found again from x; with the forward's
//          output kept (p.kept), only where x equals the window's largest, by looking for
//          a tie before it.
//   MODE 2 average forward, MODE 3 average backward: the window's mean; the divisor
//          counts padding when p.include_pad (PyTorch's count_include_pad) and not past
//          the padded edge. With p.adaptive, output i covers
//          [floor(i H / P), ceil((i + 1) H / P)) (AdaptiveAvgPool2d).
// Template: ENABLE, TX (x), TS (x or dy), TD (y or dx), MODE, VEC (channels in fours,
// max pool only: forward, and backward with the forward's output kept).
{{ENABLE}}

struct Params {
    n: u32, h: u32, w: u32, c: u32,
    p: u32, q: u32, kh: u32, kw: u32,
    sh: u32, sw: u32, ph: u32, pw: u32,
    adaptive: u32, include_pad: u32, total: u32, kept: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
//#if VEC
@group(0) @binding(1) var<storage, read_write> x: array<vec4<{{TX}}>>;
@group(0) @binding(2) var<storage, read_write> src: array<vec4<{{TS}}>>;
@group(0) @binding(3) var<storage, read_write> dst: array<vec4<{{TD}}>>;
@group(0) @binding(4) var<storage, read_write> ymax: array<vec4<{{TX}}>>;
//#else
@group(0) @binding(1) var<storage, read_write> x: array<{{TX}}>;
@group(0) @binding(2) var<storage, read_write> src: array<{{TS}}>;
@group(0) @binding(3) var<storage, read_write> dst: array<{{TD}}>;
// MODE 1 with p.kept: the forward's output (else x again, unread).
@group(0) @binding(4) var<storage, read_write> ymax: array<{{TX}}>;
//#endif

const MODE: u32 = {{MODE}}u;

// The window of output (i, j): rows [y0, y1), columns [x0, x1) clipped to the input,
// and its divisor.
struct Window { y0: i32, y1: i32, x0: i32, x1: i32, div: f32 }

fn window(i: u32, j: u32) -> Window {
    if p.adaptive != 0u {
        let y0 = (i * p.h) / p.p;
        let y1 = ((i + 1u) * p.h + p.p - 1u) / p.p;
        let x0 = (j * p.w) / p.q;
        let x1 = ((j + 1u) * p.w + p.q - 1u) / p.q;
        return Window(i32(y0), i32(y1), i32(x0), i32(x1), f32((y1 - y0) * (x1 - x0)));
    }
    let ys = i32(i * p.sh) - i32(p.ph);
    let xs = i32(j * p.sw) - i32(p.pw);
    let ye = min(ys + i32(p.kh), i32(p.h + p.ph));
    let xe = min(xs + i32(p.kw), i32(p.w + p.pw));
    let padded = f32((ye - ys) * (xe - xs));
    let y0 = max(ys, 0);
    let x0 = max(xs, 0);
    let y1 = min(ye, i32(p.h));
    let x1 = min(xe, i32(p.w));
    var div = f32((y1 - y0) * (x1 - x0));
    if p.include_pad != 0u { div = padded; }
    return Window(y0, y1, x0, x1, div);
}

// The outputs along one axis whose windows may hold input index `at` (len in, out out).
fn reach(at: u32, len: u32, out: u32, k: u32, s: u32, pad: u32) -> vec2<u32> {
    if p.adaptive != 0u {
        let lo = (at * out) / len;
        return vec2<u32>(select(lo - 1u, 0u, lo == 0u), min(out, ((at + 1u) * out + len - 1u) / len + 1u));
    }
    let top = i32(at + pad);
    let lo = max(0, (top - i32(k) + i32(s)) / i32(s));
    let hi = min(i32(out), top / i32(s) + 1);
    return vec2<u32>(u32(lo), u32(max(hi, lo)));
}

//#if VEC
// Channels in fours (a max pool, forward or backward with the forward's output kept):
// a thread takes 4 channels of one pixel, one vector a load.

// Per channel, whether x at `e` (a pixel's first channel of the vector), equal to
// window (i, j)'s largest `top` where `cand`, is its first largest: no element before
// it in the window ties. Stops once no channel is left.
fn first_top(n: u32, i: u32, j: u32, c: u32, e: u32, top: vec4<f32>, cand0: vec4<bool>) -> vec4<bool> {
    let win = window(i, j);
    var cand = cand0;
    for (var yy = win.y0; yy < win.y1; yy++) {
        for (var xx = win.x0; xx < win.x1; xx++) {
            let at = ((n * p.h + u32(yy)) * p.w + u32(xx)) * p.c + c;
            if at == e { return cand; }
            let v = vec4<f32>(x[at / 4u]);
            cand = cand & !((v == top) | ((v != v) & (top != top)));
            if !any(cand) { return cand; }
        }
    }
    return cand;
}

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let t = gid.x + gid.y * nwg.x * 256u;
    if t >= p.total { return; }
    let e = t * 4u;
    let c = e % p.c;
    if MODE == 0u {
        let j = (e / p.c) % p.q;
        let i = (e / (p.c * p.q)) % p.p;
        let n = e / (p.c * p.q * p.p);
        let win = window(i, j);
        var top = vec4<f32>(0.0);
        var found = false;
        for (var yy = win.y0; yy < win.y1; yy++) {
            for (var xx = win.x0; xx < win.x1; xx++) {
                let v = vec4<f32>(x[(((n * p.h + u32(yy)) * p.w + u32(xx)) * p.c + c) / 4u]);
                if !found {
                    top = v;
                    found = true;
                } else {
                    top = select(top, v, (v > top) | ((v != v) & (top == top)));
                }
            }
        }
        dst[t] = vec4<{{TD}}>(top);
        return;
    }
    let xx = (e / p.c) % p.w;
    let yy = (e / (p.c * p.w)) % p.h;
    let n = e / (p.c * p.w * p.h);
    let ri = reach(yy, p.h, p.p, p.kh, p.sh, p.ph);
    let rj = reach(xx, p.w, p.q, p.kw, p.sw, p.pw);
    let v = vec4<f32>(x[t]);
    var acc = vec4<f32>(0.0);
    for (var i = ri.x; i < ri.y; i++) {
        for (var j = rj.x; j < rj.y; j++) {
            let win = window(i, j);
            if i32(yy) < win.y0 || i32(yy) >= win.y1 || i32(xx) < win.x0 || i32(xx) >= win.x1 { continue; }
            let o = (((n * p.p + i) * p.q + j) * p.c + c) / 4u;
            let top = vec4<f32>(ymax[o]);
            let cand = (v == top) | ((v != v) & (top != top));
            if !any(cand) { continue; }
            acc += select(vec4<f32>(0.0), vec4<f32>(src[o]), first_top(n, i, j, c, e, top, cand));
        }
    }
    dst[t] = vec4<{{TD}}>(acc);
}
//#else
// The flat index in x of window (i, j)'s first largest element of image n, channel c.
fn argmax(n: u32, i: u32, j: u32, c: u32) -> u32 {
    let win = window(i, j);
    var best = 0u;
    var top = 0.0;
    var found = false;
    for (var yy = win.y0; yy < win.y1; yy++) {
        for (var xx = win.x0; xx < win.x1; xx++) {
            let at = ((n * p.h + u32(yy)) * p.w + u32(xx)) * p.c + c;
            let v = f32(x[at]);
            if !found || v > top || (v != v && top == top) {
                best = at;
                top = v;
                found = true;
            }
        }
    }
    return best;
}

// Whether x[e], equal to window (i, j)'s largest `top` (NaN where the window holds a
// NaN), is its first largest: no element before it in the window equals top. Scans
// only up to e and stops at the first tie (a window of ReLU zeros costs one load).
fn first_top(n: u32, i: u32, j: u32, c: u32, e: u32, top: f32) -> bool {
    let win = window(i, j);
    for (var yy = win.y0; yy < win.y1; yy++) {
        for (var xx = win.x0; xx < win.x1; xx++) {
            let at = ((n * p.h + u32(yy)) * p.w + u32(xx)) * p.c + c;
            if at == e { return true; }
            let v = f32(x[at]);
            if v == top || (v != v && top != top) { return false; }
        }
    }
    return false;
}

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let e = gid.x + gid.y * nwg.x * 256u;
    if e >= p.total { return; }
    let c = e % p.c;
    if MODE == 0u || MODE == 2u {
        let j = (e / p.c) % p.q;
        let i = (e / (p.c * p.q)) % p.p;
        let n = e / (p.c * p.q * p.p);
        if MODE == 0u {
            dst[e] = {{TD}}(f32(x[argmax(n, i, j, c)]));
            return;
        }
        let win = window(i, j);
        var acc = 0.0;
        for (var yy = win.y0; yy < win.y1; yy++) {
            for (var xx = win.x0; xx < win.x1; xx++) {
                acc += f32(x[((n * p.h + u32(yy)) * p.w + u32(xx)) * p.c + c]);
            }
        }
        dst[e] = {{TD}}(acc / win.div);
        return;
    }
    let xx = (e / p.c) % p.w;
    let yy = (e / (p.c * p.w)) % p.h;
    let n = e / (p.c * p.w * p.h);
    let ri = reach(yy, p.h, p.p, p.kh, p.sh, p.ph);
    let rj = reach(xx, p.w, p.q, p.kw, p.sw, p.pw);
    var acc = 0.0;
    for (var i = ri.x; i < ri.y; i++) {
        for (var j = rj.x; j < rj.y; j++) {
            let win = window(i, j);
            if i32(yy) < win.y0 || i32(yy) >= win.y1 || i32(xx) < win.x0 || i32(xx) >= win.x1 { continue; }
            let g = f32(src[((n * p.p + i) * p.q + j) * p.c + c]);
            if MODE == 1u {
                // Where the window's largest is kept, only an element equal to it (or a
                // NaN where it is NaN) can be its first largest: ties are searched.
                if p.kept != 0u {
                    let top = f32(ymax[((n * p.p + i) * p.q + j) * p.c + c]);
                    let v = f32(x[e]);
                    if v != top && !(v != v && top != top) { continue; }
                    if first_top(n, i, j, c, e, top) { acc += g; }
                } else if argmax(n, i, j, c) == e {
                    acc += g;
                }
            } else {
                acc += g / win.div;
            }
        }
    }
    dst[e] = {{TD}}(acc);
}
//#endif
