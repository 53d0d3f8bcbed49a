//! What the unit tests share.

/// A test that cannot run here says so and why: on stderr, and in the file that
/// `GRANARY_SKIPPED` names, which `tests/run.sh` lists at the end of the run. The caller
/// then returns: a skipped test is reported, never counted as a pass unseen.
pub fn skipped(reason: &str) {
    let name = std::thread::current().name().unwrap_or("?").to_owned();
    eprintln!("SKIPPED {name}: {reason}");
    if let Some(path) = std::env::var_os("GRANARY_SKIPPED") {
        use std::io::Write;
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            let _ = writeln!(f, "{name}: {reason}");
        }
    }
}
