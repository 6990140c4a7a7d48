// Shared activation functions, pasted into kernels at their ACTIVATIONS placeholder.
// The including kernel defines `alias V` (f32 or vec4<f32>).
fn S(x: f32) -> V { return V(x); }

// tanh that stays finite for large |x| (exp overflows in the textbook form).
fn tanh_s(x: V) -> V {
    let e = exp(S(-2.0) * abs(x));
    return sign(x) * (S(1.0) - e) / (S(1.0) + e);
}

// GPT-2's gelu (tanh approximation) and its derivative.
fn gelu(x: V) -> V {
    let u = S(0.7978845608028654) * (x + S(0.044715) * x * x * x);
    return S(0.5) * x * (S(1.0) + tanh_s(u));
}

fn gelu_grad(x: V) -> V {
    let u = S(0.7978845608028654) * (x + S(0.044715) * x * x * x);
    let t = tanh_s(u);
    let du = S(0.7978845608028654) * (S(1.0) + S(3.0 * 0.044715) * x * x);
    return S(0.5) * (S(1.0) + t) + S(0.5) * x * (S(1.0) - t * t) * du;
}
