//! Every WGSL template variant renders with no placeholder left and passes naga's
//! validator (f16 and cooperative matrices included) and naga's SPIR-V writer takes it,
//! without a GPU.

use wgtrain_engine::kernels::variants;

#[test]
fn every_variant_renders_and_validates() {
    let all = variants::all().expect("every variant renders");
    assert!(all.len() > 100, "only {} variants", all.len());
    let mut failures = Vec::new();
    for v in &all {
        let module = match naga::front::wgsl::parse_str(&v.wgsl) {
            Ok(m) => m,
            Err(e) => {
                failures.push(format!("{} {}: {}", v.name, v.values, e.emit_to_string(&v.wgsl)));
                continue;
            }
        };
        let mut validator = naga::valid::Validator::new(naga::valid::ValidationFlags::all(), naga::valid::Capabilities::all());
        let info = match validator.validate(&module) {
            Ok(info) => info,
            Err(e) => {
                failures.push(format!("{} {}: {}", v.name, v.values, e.emit_to_string(&v.wgsl)));
                continue;
            }
        };
        // SPIR-V is what Vulkan adapters get: naga's writer must take every variant
        // (it has panicked on cooperative-matrix operands it had not cached).
        let options = naga::back::spv::Options {
            lang_version: (1, 6),
            ..Default::default()
        };
        let spirv = std::panic::catch_unwind(|| naga::back::spv::write_vec(&module, &info, &options, None));
        match spirv {
            Ok(Ok(words)) if !words.is_empty() => {}
            Ok(Ok(_)) => failures.push(format!("{} {}: empty SPIR-V", v.name, v.values)),
            Ok(Err(e)) => failures.push(format!("{} {}: SPIR-V: {e}", v.name, v.values)),
            Err(_) => failures.push(format!("{} {}: the SPIR-V writer panicked", v.name, v.values)),
        }
    }
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
