//! The app's files, built from source by build.rs (web/app compiled to wasm32 and run
//! through wasm-bindgen) and embedded: no request reads a file of the app from disk.
//!
//! May call: nothing. Called by: `server`.

/// The page.
pub const INDEX_HTML: &str = include_str!("../../app/index.html");
/// Its styles.
pub const STYLE_CSS: &str = include_str!("../../app/style.css");
/// wasm-bindgen's loader.
pub const APP_JS: &str = include_str!(concat!(env!("OUT_DIR"), "/app.js"));
/// The compiled app.
pub const APP_WASM: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/app_bg.wasm"));
