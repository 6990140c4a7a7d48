// Fused optimizer steps over f32 master weights, one pass per parameter.
//   MODE 0 unscale and check: grad *= inv_scale in place; found[0] = 1 if any result is
//                  inf or NaN (torch's _amp_foreach_non_finite_check_and_unscale_)
//   MODE 1 AdamW:  PyTorch's torch.optim.AdamW (decoupled weight decay, bias correction)
//   MODE 2 SGD:    PyTorch's torch.optim.SGD with momentum, dampening, nesterov
// Updates skip entirely when p.skip_if_found is set and found[0] != 0 (GradScaler).
// Gradients are multiplied by p.inv_scale first (1 when not scaling). The weights and
// the gradient may start at an element offset (one rank's shard of a parameter).
// With HALF (AdamW and SGD), the updated weight's f16 copy (what fp16-mixed's products
// read) is written in the same pass, at p.half_offset.
// Template: MODE, HALF.
//#if HALF
enable f16;
//#endif

struct Params {
    n: u32,
    skip_if_found: u32,
    first_step: u32,
    nesterov: u32,
    lr: f32,
    beta1: f32,       // SGD: momentum
    beta2: f32,       // SGD: dampening
    eps: f32,
    weight_decay: f32,
    bias_correction1: f32,
    bias_correction2_sqrt: f32,
    inv_scale: f32,
    param_offset: u32, // elements: the update may touch a shard of a parameter
    grad_offset: u32,
    half_offset: u32,
    pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> param: array<f32>;
@group(0) @binding(2) var<storage, read_write> grad: array<f32>;
@group(0) @binding(3) var<storage, read_write> m: array<f32>;   // AdamW exp_avg; SGD momentum buffer
@group(0) @binding(4) var<storage, read_write> v: array<f32>;   // AdamW exp_avg_sq
@group(0) @binding(5) var<storage, read_write> found: array<atomic<u32>>;
//#if HALF
@group(0) @binding(6) var<storage, read_write> half_out: array<f16>;
//#endif

const MODE: u32 = {{MODE}}u;

fn finite(x: f32) -> bool {
    // NaN fails every comparison; inf exceeds the largest finite f32.
    return abs(x) <= 3.4028235e38;
}

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * 256u;
    if i >= p.n { return; }
    let gi = p.grad_offset + i;
    let g0 = grad[gi] * p.inv_scale;
    if MODE == 0u {
        grad[gi] = g0;
        if !finite(g0) { atomicStore(&found[0], 1u); }
        return;
    }
    if p.skip_if_found != 0u && atomicLoad(&found[0]) != 0u { return; }
    let wi = p.param_offset + i;
    var w = param[wi];
    if MODE == 1u {
        w = w * (1.0 - p.lr * p.weight_decay);
        let mi = p.beta1 * m[i] + (1.0 - p.beta1) * g0;
        let vi = p.beta2 * v[i] + (1.0 - p.beta2) * g0 * g0;
        m[i] = mi;
        v[i] = vi;
        let denom = sqrt(vi) / p.bias_correction2_sqrt + p.eps;
        w = w - (p.lr / p.bias_correction1) * mi / denom;
    } else {
        var g = g0 + p.weight_decay * w;
        var buf = g;
        if p.first_step == 0u { buf = p.beta1 * m[i] + (1.0 - p.beta2) * g; }
        m[i] = buf;
        if p.nesterov != 0u { g = g + p.beta1 * buf; } else { g = buf; }
        w = w - p.lr * g;
    }
    param[wi] = w;
//#if HALF
    half_out[p.half_offset + i] = f16(w);
//#endif
}
