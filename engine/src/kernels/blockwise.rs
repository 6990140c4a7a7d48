//! The 8-bit optimizer state of `train.optimizer = "adamw8bit"` (bitsandbytes' blockwise
//! 8-bit Adam, with PyTorch AdamW's arithmetic): each moment of a parameter of at least
//! [`MIN_ELEMENTS`] elements is kept as one byte per element, a code into a 256-value
//! "dynamic" map (signed for the first moment, unsigned for the second), scaled per block
//! of [`BLOCK`] elements by the block's largest magnitude. Smaller parameters keep f32
//! state, as bitsandbytes does.
//!
//! On the device a moment is one u32 tensor of [`words`] words: the codes, four to a word
//! (element k of a word in bits 8k..8k+8), then each block's absmax as f32 bits. The
//! shader (shaders/optim8.wgsl) and the host functions here quantize the same way: the
//! nearest map value, ties to the lower code.
//!
//! May call: nothing of the engine (std only). Called by: `kernels::optim`, `optim`, the
//! trainer's checkpoints, the estimate.

/// Elements a block of codes shares one absmax over.
pub const BLOCK: usize = 256;
/// Parameters with fewer elements keep f32 state (bitsandbytes' `min_8bit_size`).
pub const MIN_ELEMENTS: usize = 4096;
/// u32 words of codes in one block.
const BLOCK_WORDS: usize = BLOCK / 4;

/// Whether a parameter of `numel` elements keeps 8-bit state.
pub fn quantized(numel: usize) -> bool {
    numel >= MIN_ELEMENTS
}

/// Blocks of a moment of `numel` elements.
pub fn blocks(numel: usize) -> usize {
    numel.div_ceil(BLOCK)
}

/// u32 words of one 8-bit moment on the device: the codes, then the absmax values.
pub fn words(numel: usize) -> usize {
    blocks(numel) * (BLOCK_WORDS + 1)
}

/// bitsandbytes' dynamic quantization map (`create_dynamic_map` with 7 exponent bits,
/// 8 bits in all), sorted: for each decade 10^-6 .. 10^0, the midpoints of an even split
/// of [0.1, 1] into 2^i parts (2^(i+1) unsigned), with their negatives when signed, and
/// 0 and 1.
pub fn dynamic_map(signed: bool) -> [f32; 256] {
    let mut data: Vec<f32> = Vec::with_capacity(256);
    for i in 0..7 {
        let parts = if signed { 1usize << i } else { 1usize << (i + 1) };
        let step = 0.9f32 / parts as f32;
        let scale = 10f32.powi(i - 6);
        for k in 0..parts {
            let lo = 0.1 + step * k as f32;
            let hi = if k + 1 == parts { 1.0 } else { 0.1 + step * (k + 1) as f32 };
            let mean = scale * ((lo + hi) / 2.0);
            data.push(mean);
            if signed {
                data.push(-mean);
            }
        }
    }
    data.push(0.0);
    data.push(1.0);
    debug_assert_eq!(data.len(), 256);
    data.sort_by(f32::total_cmp);
    let mut out = [0.0; 256];
    out.copy_from_slice(&data);
    out
}

/// The code of `x` (a value in [-1, 1] after dividing by its block's absmax): the
/// nearest map value, ties to the lower code (the shader's binary search).
pub fn nearest(map: &[f32; 256], x: f32) -> u8 {
    let mut lo = 0usize;
    let mut step = 128;
    while step > 0 {
        if lo + step < 256 && map[lo + step] <= x {
            lo += step;
        }
        step /= 2;
    }
    if lo < 255 && (map[lo + 1] - x).abs() < (x - map[lo]).abs() {
        lo += 1;
    }
    lo as u8
}

/// Quantizes `values` blockwise: each block's absmax (its largest magnitude), and each
/// value's code for value / absmax (0 where the block is all zeros). `absmax`, when
/// given, is used instead of the blocks' own (placing a saved state back exactly),
/// except where it is NaN (a block the saved state kept in f32).
pub fn quantize(map: &[f32; 256], values: &[f32], absmax: Option<&[f32]>) -> (Vec<u8>, Vec<f32>) {
    let zero = nearest(map, 0.0);
    let mut codes = Vec::with_capacity(values.len());
    let mut scales = Vec::with_capacity(blocks(values.len()));
    for (b, block) in values.chunks(BLOCK).enumerate() {
        let a = absmax
            .and_then(|a| a.get(b).copied())
            .filter(|a| !a.is_nan())
            .unwrap_or_else(|| block.iter().fold(0.0f32, |m, x| m.max(x.abs())));
        scales.push(a);
        codes.extend(block.iter().map(|&x| if a > 0.0 { nearest(map, x / a) } else { zero }));
    }
    (codes, scales)
}

/// The values `codes` and the blocks' `absmax` stand for.
pub fn dequantize(map: &[f32; 256], codes: &[u8], absmax: &[f32]) -> Vec<f32> {
    codes
        .iter()
        .enumerate()
        .map(|(k, &c)| map[c as usize] * absmax[k / BLOCK])
        .collect()
}

/// The device layout of a moment: codes four to a word, padded to whole blocks with the
/// code of 0, then the absmax values' bits.
pub fn pack(map: &[f32; 256], codes: &[u8], absmax: &[f32]) -> Vec<u32> {
    let n_blocks = blocks(codes.len());
    let zero = nearest(map, 0.0);
    let mut out = vec![0u32; words(codes.len())];
    for k in 0..n_blocks * BLOCK {
        let c = codes.get(k).copied().unwrap_or(zero) as u32;
        out[k / 4] |= c << (8 * (k % 4));
    }
    for (b, a) in absmax.iter().enumerate().take(n_blocks) {
        out[n_blocks * BLOCK_WORDS + b] = a.to_bits();
    }
    out
}

/// [`pack`] undone for a moment of `numel` elements: (codes, absmax).
pub fn unpack(words: &[u32], numel: usize) -> (Vec<u8>, Vec<f32>) {
    let n_blocks = blocks(numel);
    let codes = (0..numel).map(|k| (words[k / 4] >> (8 * (k % 4))) as u8).collect();
    let absmax = words[n_blocks * BLOCK_WORDS..n_blocks * (BLOCK_WORDS + 1)]
        .iter()
        .map(|&w| f32::from_bits(w))
        .collect();
    (codes, absmax)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_maps_hold_256_sorted_values_from_their_least_to_one() {
        let s = dynamic_map(true);
        let u = dynamic_map(false);
        assert!(s.windows(2).all(|w| w[0] < w[1]) && u.windows(2).all(|w| w[0] < w[1]));
        assert_eq!((s[255], u[255], u[0]), (1.0, 1.0, 0.0));
        assert!(s[0] < -0.99 && s[0] > -1.0, "{}", s[0]);
        // The smallest nonzero magnitude is the 10^-6 decade's one midpoint.
        let least = s.iter().filter(|x| **x > 0.0).fold(1.0f32, |m, x| m.min(*x));
        assert!((least - 0.55e-6).abs() < 1e-9, "{least}");
    }

    #[test]
    fn packing_round_trips_and_the_largest_magnitude_keeps_its_value() {
        let map = dynamic_map(true);
        let values: Vec<f32> = (0..600).map(|k| ((k * 37 % 101) as f32 - 50.0) * 1e-3).collect();
        let (codes, absmax) = quantize(&map, &values, None);
        assert_eq!(absmax.len(), 3);
        let words = pack(&map, &codes, &absmax);
        assert_eq!(words.len(), super::words(600));
        assert_eq!(unpack(&words, 600), (codes.clone(), absmax.clone()));
        let back = dequantize(&map, &codes, &absmax);
        for (x, y) in values.iter().zip(&back) {
            // The map's steps near 1 are 1/64 of the absmax wide at most.
            assert!((x - y).abs() <= 0.05 * 0.0071 + 1e-7, "{x} {y}");
        }
        // Requantizing what was dequantized, with the same absmax, gives the same codes.
        assert_eq!(quantize(&map, &back, Some(&absmax)).0, codes);
    }
}
