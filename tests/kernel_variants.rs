//! Every WGSL template variant renders with no placeholder left and passes naga's
//! validator (f16 and cooperative matrices included) and naga's SPIR-V writer takes it,
//! without a GPU.

use rayon::prelude::*;
use wgtrain_engine::kernels::variants::{self, Variant};

/// What is wrong with `v`: naga's parser, its validator or its SPIR-V writer refusing it.
fn check(v: &Variant) -> Option<String> {
    let fail = |what: String| Some(format!("{} {}: {what}", v.name, v.values));
    let module = match naga::front::wgsl::parse_str(&v.wgsl) {
        Ok(m) => m,
        Err(e) => return fail(e.emit_to_string(&v.wgsl)),
    };
    let mut validator = naga::valid::Validator::new(naga::valid::ValidationFlags::all(), naga::valid::Capabilities::all());
    let info = match validator.validate(&module) {
        Ok(info) => info,
        Err(e) => return fail(e.emit_to_string(&v.wgsl)),
    };
    // SPIR-V is what Vulkan adapters get: naga's writer must take every variant (it has
    // panicked on cooperative-matrix operands it had not cached).
    let options = naga::back::spv::Options {
        lang_version: (1, 6),
        ..Default::default()
    };
    match std::panic::catch_unwind(|| naga::back::spv::write_vec(&module, &info, &options, None)) {
        Ok(Ok(words)) if !words.is_empty() => None,
        Ok(Ok(_)) => fail("empty SPIR-V".into()),
        Ok(Err(e)) => fail(format!("SPIR-V: {e}")),
        Err(_) => fail("the SPIR-V writer panicked".into()),
    }
}

#[test]
fn every_variant_renders_and_validates() {
    let all = variants::all().expect("every variant renders");
    assert!(all.len() > 100, "only {} variants", all.len());
    // One variant a task over every core (naga is single-threaded; cargo runs one test
    // binary at a time, so a loop here would leave the other cores idle).
    let failures: Vec<String> = all.par_iter().filter_map(check).collect();
    assert!(
        failures.is_empty(),
        "{} of {} variants fail:\n{}",
        failures.len(),
        all.len(),
        failures.join("\n")
    );
}

#[test]
fn a_missing_template_value_is_an_error() {
    let err = wgtrain_engine::runtime::render("t", "fn f() -> {{T}} {}", &[]).unwrap_err();
    assert!(err.to_string().contains("{{T}}"), "{err}");
}
