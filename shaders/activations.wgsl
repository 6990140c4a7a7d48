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

// SiLU's derivative: sigmoid(x) * (1 + x * (1 - sigmoid(x))).
fn silu_grad(x: V) -> V {
    let s = S(1.0) / (S(1.0) + exp(-x));
    return s * (S(1.0) + x * (S(1.0) - s));
}

// erf through the Chebyshev fit of erfc in Numerical Recipes (fractional error below
// 1.2e-7 everywhere: WGSL has no erf builtin).
fn erf_s(x: V) -> V {
    let z = abs(x);
    let t = S(1.0) / (S(1.0) + S(0.5) * z);
    let r = t * exp(-z * z - S(1.26551223) + t * (S(1.00002368) + t * (S(0.37409196) + t * (S(0.09678418)
        + t * (S(-0.18628806) + t * (S(0.27886807) + t * (S(-1.13520398) + t * (S(1.48851587)
        + t * (S(-0.82215223) + t * S(0.17087277))))))))));
    return sign(x) * (S(1.0) - r);
}

// The exact gelu, x * Phi(x), and its derivative Phi(x) + x * phi(x).
fn gelu_erf(x: V) -> V {
    return S(0.5) * x * (S(1.0) + erf_s(x * S(0.7071067811865476)));
}

fn gelu_erf_grad(x: V) -> V {
    let cdf = S(0.5) * (S(1.0) + erf_s(x * S(0.7071067811865476)));
    return cdf + x * S(0.3989422804014327) * exp(S(-0.5) * x * x);
}
