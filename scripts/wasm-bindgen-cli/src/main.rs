//! `fovea-wasm-bindgen MODULE.wasm OUT_DIR [web|nodejs|bundler]`: writes the
//! JS glue and the processed module of a wasm-bindgen crate (the same as
//! `wasm-bindgen --target T --out-dir OUT_DIR MODULE.wasm`).

use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [module, out, rest @ ..] = args.as_slice() else {
        eprintln!("usage: fovea-wasm-bindgen MODULE.wasm OUT_DIR [web|nodejs|bundler]");
        return ExitCode::from(2);
    };
    let mut bindgen = wasm_bindgen_cli_support::Bindgen::new();
    bindgen.input_path(module).typescript(true);
    let target = rest.first().map_or("nodejs", String::as_str);
    let set = match target {
        "web" => bindgen.web(true).map(|_| ()),
        "nodejs" => bindgen.nodejs(true).map(|_| ()),
        "bundler" => bindgen.bundler(true).map(|_| ()),
        other => {
            eprintln!("unknown target {other}: web, nodejs or bundler");
            return ExitCode::from(2);
        }
    };
    if let Err(e) = set.and_then(|()| bindgen.generate(out)) {
        eprintln!("wasm-bindgen {module}: {e:#}");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
