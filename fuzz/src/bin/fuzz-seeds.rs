//! `fuzz-seeds DIR`: writes the fuzz targets' seed inputs in the engine's
//! formats under DIR/<target>/ (scripts/fuzz.sh runs it before fuzzing).

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let out = PathBuf::from(std::env::args().nth(1).ok_or("usage: fuzz-seeds DIR")?);
    let tasks = fovea_fuzz_targets::seeds::write_seeds(&out)?;
    println!("fuzz seeds in {} ({tasks} split tasks)", out.display());
    Ok(())
}
