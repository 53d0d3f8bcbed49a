//! Running the real `granaryctl` binary against a test server.

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

use crate::server::granary_bin;

/// `$GRANARYCTL_BIN`, else `granaryctl` beside [`granary_bin`] (both are built into
/// `target/release` by `cargo build --release --workspace`).
pub fn granaryctl_bin() -> PathBuf {
    if let Some(bin) = std::env::var_os("GRANARYCTL_BIN") {
        return PathBuf::from(bin);
    }
    granary_bin().with_file_name("granaryctl")
}

/// Runs `granaryctl --endpoint ENDPOINT ARGS…` with `stdin` as its standard input and no
/// `GRANARY_*`/`AWS_*` settings from the developer's environment; returns its exit status
/// and output.
pub fn granaryctl(endpoint: &str, args: &[&str], stdin: &[u8]) -> anyhow::Result<Output> {
    granaryctl_with_env(endpoint, args, stdin, &[])
}

/// [`granaryctl`] with these environment variables set.
pub fn granaryctl_with_env(
    endpoint: &str,
    args: &[&str],
    stdin: &[u8],
    env: &[(&str, &str)],
) -> anyhow::Result<Output> {
    use std::io::Write;
    let bin = granaryctl_bin();
    if !bin.exists() {
        anyhow::bail!(
            "granaryctl not found at {} (build it with `cargo build --release -p granary-client` or set GRANARYCTL_BIN)",
            bin.display()
        );
    }
    let mut cmd = Command::new(&bin);
    cmd.arg("--endpoint").arg(endpoint).args(args);
    for (key, _) in std::env::vars_os() {
        let k = key.to_string_lossy();
        if k.starts_with("GRANARY_") || k.starts_with("AWS_") {
            cmd.env_remove(&key);
        }
    }
    cmd.envs(env.iter().copied());
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let mut input = child.stdin.take().expect("piped");
    let data = stdin.to_vec();
    let writer = std::thread::spawn(move || {
        let _ = input.write_all(&data);
    });
    let out = child.wait_with_output()?;
    let _ = writer.join();
    Ok(out)
}
