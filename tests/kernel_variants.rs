//! Every WGSL template variant renders with no placeholder left and passes naga's
//! validator (f16 and cooperative matrices included), without a GPU.

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
        if let Err(e) = validator.validate(&module) {
            failures.push(format!("{} {}: {}", v.name, v.values, e.emit_to_string(&v.wgsl)));
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
