//! The exec transform: an external program turns an object's bytes (on its stdin) into the
//! transformed bytes (on its stdout).
//!
//! This module owns one run of the program: spawning it without a shell in a clean
//! environment and its own process group, feeding stdin while draining stdout and stderr
//! (so neither side can block the other on a full pipe), and the limits that keep a bad
//! program from hurting the node: a wall-clock timeout, a cap on the output held in memory
//! and an address-space limit. On any failure, and when the caller drops the future, the
//! whole process group is killed, so helpers the program forked go too. How many runs may
//! go at once is the caller's business; [`concurrency`] only says how many the spec asks for.

use std::collections::BTreeMap;
use std::io;
use std::process::Stdio;
use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, Command};

/// How much of the program's stderr a [`ExecError::Failed`] carries.
const STDERR_KEPT: usize = 4 * 1024;

/// The most bytes asked of the stdout pipe in one read.
const READ_CHUNK: u64 = 64 * 1024;

/// Which program the exec transform runs, and its limits.
#[derive(Debug, Clone, PartialEq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct ExecSpec {
    /// Program and arguments, run directly (no shell). Must be non-empty. The program is
    /// looked up in the node's PATH.
    pub command: Vec<String>,
    /// Wall-clock limit in seconds for the whole run (default 30).
    #[serde(default = "default_timeout_secs")]
    pub timeout_secs: f64,
    /// Most bytes of output accepted (default 256 MiB); more is an error.
    #[serde(default = "default_max_output")]
    pub max_output: u64,
    /// Address-space limit for the program in bytes (RLIMIT_AS; default 4 GiB; 0 = none).
    /// Runtimes that reserve much more address space than they use may need a higher one.
    #[serde(default = "default_memory")]
    pub memory: u64,
    /// Most runs of this transform at once on a node (default: the number of CPUs).
    #[serde(default)]
    pub concurrency: Option<usize>,
    /// Extra environment variables. The program's environment is cleared except PATH and
    /// these (which may override PATH).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
}

fn default_timeout_secs() -> f64 {
    30.0
}

fn default_max_output() -> u64 {
    256 * 1024 * 1024
}

fn default_memory() -> u64 {
    4 * 1024 * 1024 * 1024
}

impl ExecSpec {
    /// Checks the spec on its own: a command, a usable timeout, a non-zero concurrency and
    /// environment names a process can carry.
    pub fn validate(&self) -> Result<(), String> {
        let Some(program) = self.command.first() else {
            return Err("exec command must name a program".to_string());
        };
        if program.is_empty() {
            return Err("exec command must name a program, not an empty string".to_string());
        }
        if let Some(arg) = self.command.iter().find(|a| a.contains('\0')) {
            return Err(format!("exec command argument {arg:?} contains a NUL byte"));
        }
        if self.timeout_secs <= 0.0 || Duration::try_from_secs_f64(self.timeout_secs).is_err() {
            return Err(format!(
                "exec timeout_secs must be a positive number of seconds, not {}",
                self.timeout_secs
            ));
        }
        if self.concurrency == Some(0) {
            return Err("exec concurrency must be at least 1".to_string());
        }
        for (name, value) in &self.env {
            if name.is_empty() || name.contains(['=', '\0']) {
                return Err(format!(
                    "exec env name {name:?} is not a valid variable name"
                ));
            }
            if value.contains('\0') {
                return Err(format!("exec env {name} contains a NUL byte"));
            }
        }
        Ok(())
    }
}

/// How many runs of this transform may go at once on a node: the spec's `concurrency`, or
/// the number of CPUs.
pub fn concurrency(spec: &ExecSpec) -> usize {
    spec.concurrency.unwrap_or_else(|| {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    })
}

/// Why a run of the program produced no output.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    /// The program could not be started (missing, not executable, or an invalid spec).
    #[error("cannot start the transform program: {0}")]
    Spawn(String),
    /// The run took longer than the limit (seconds); the program was killed.
    #[error("the transform program ran past its {0} s limit and was killed")]
    Timeout(f64),
    /// The program wrote more than the limit (bytes); it was killed.
    #[error("the transform program wrote more than {0} bytes and was killed")]
    TooMuchOutput(u64),
    /// The program exited non-zero or was killed by a signal.
    #[error("the transform program failed ({status}): {stderr}")]
    Failed {
        /// The exit status as the OS reports it, e.g. "exit status: 3".
        status: String,
        /// The first 4 KiB of its stderr, lossily decoded as UTF-8.
        stderr: String,
    },
    /// Talking to the program over its pipes failed.
    #[error("i/o with the transform program failed: {0}")]
    Io(String),
}

/// Runs the command with `input` on stdin and returns its stdout.
///
/// The program runs in its own process group, which is killed with SIGKILL on timeout, on
/// too much output, on a pipe error and when the returned future is dropped. Stdout is
/// read with a bound: at most `max_output` + 1 bytes are ever held. A program that exits
/// 0 without reading all of its stdin is fine; one that exits non-zero or by a signal is
/// [`ExecError::Failed`].
pub async fn run(spec: &ExecSpec, input: Bytes) -> Result<Vec<u8>, ExecError> {
    spec.validate()
        .map_err(|e| ExecError::Spawn(format!("invalid spec: {e}")))?;
    let mut cmd = Command::new(&spec.command[0]);
    cmd.args(&spec.command[1..])
        .env_clear()
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    if let Some(path) = std::env::var_os("PATH") {
        cmd.env("PATH", path);
    }
    cmd.envs(&spec.env);
    if spec.memory > 0 {
        let limit = libc::rlimit {
            rlim_cur: spec.memory as libc::rlim_t,
            rlim_max: spec.memory as libc::rlim_t,
        };
        // SAFETY: the closure runs in the forked child before exec, where only
        // async-signal-safe work is allowed. It makes one setrlimit call, a thin wrapper
        // over the system call that takes no locks and allocates nothing, and on failure
        // reads errno into an io::Error, which does not allocate either. It touches no
        // state shared with the parent's other threads.
        unsafe {
            cmd.pre_exec(move || {
                if libc::setrlimit(libc::RLIMIT_AS, &limit) == 0 {
                    Ok(())
                } else {
                    Err(io::Error::last_os_error())
                }
            });
        }
    }
    let child = cmd
        .spawn()
        .map_err(|e| ExecError::Spawn(format!("{}: {e}", spec.command[0])))?;
    let mut group = Group(child);
    let timeout = Duration::from_secs_f64(spec.timeout_secs);
    match tokio::time::timeout(timeout, talk(&mut group.0, input, spec.max_output)).await {
        Ok(result) => result,
        Err(_) => Err(ExecError::Timeout(spec.timeout_secs)),
    }
    // `group` drops here: unless the child was reaped after a clean exit, its process group
    // is killed.
}

/// Feeds stdin, drains stdout and stderr, then reaps the child.
async fn talk(child: &mut Child, input: Bytes, max_output: u64) -> Result<Vec<u8>, ExecError> {
    let (Some(mut stdin), Some(mut stdout), Some(mut stderr)) =
        (child.stdin.take(), child.stdout.take(), child.stderr.take())
    else {
        return Err(ExecError::Io(
            "the program's pipes were not set up".to_string(),
        ));
    };
    let feed = async move {
        match stdin.write_all(&input).await {
            // A program may finish without reading all of its input; its exit status
            // says whether that was fine.
            Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(()),
            Err(e) => Err(ExecError::Io(format!("writing stdin: {e}"))),
            Ok(()) => Ok(()),
        }
        // Dropping stdin here closes it, so the program sees the end of its input.
    };
    let drain_out = read_bounded(&mut stdout, max_output);
    let drain_err = async {
        read_head(&mut stderr, STDERR_KEPT)
            .await
            .map_err(|e| ExecError::Io(format!("reading stderr: {e}")))
    };
    // The pipes close when the program (and anything it forked that kept them) exits.
    // Until `wait` below the child is not reaped, so its pid, and with it the process
    // group id, cannot be reused while `Group` may still kill it.
    let ((), out, err) = tokio::try_join!(feed, drain_out, drain_err)?;
    let status = child
        .wait()
        .await
        .map_err(|e| ExecError::Io(format!("waiting for the program: {e}")))?;
    if status.success() {
        Ok(out)
    } else {
        Err(ExecError::Failed {
            status: status.to_string(),
            stderr: String::from_utf8_lossy(&err).into_owned(),
        })
    }
}

/// Reads `r` to its end, failing as soon as more than `max` bytes arrive.
async fn read_bounded<R: AsyncRead + Unpin>(r: &mut R, max: u64) -> Result<Vec<u8>, ExecError> {
    let mut out = Vec::new();
    let mut limited = r.take(max.saturating_add(1));
    loop {
        out.reserve(READ_CHUNK.min(limited.limit()) as usize);
        let n = limited
            .read_buf(&mut out)
            .await
            .map_err(|e| ExecError::Io(format!("reading stdout: {e}")))?;
        if n == 0 {
            return Ok(out);
        }
        if out.len() as u64 > max {
            return Err(ExecError::TooMuchOutput(max));
        }
    }
}

/// Reads `r` to its end, keeping the first `keep` bytes and discarding the rest (a chatty
/// program must not block on a full stderr pipe).
async fn read_head<R: AsyncRead + Unpin>(r: &mut R, keep: usize) -> io::Result<Vec<u8>> {
    let mut head = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        let n = r.read(&mut buf).await?;
        if n == 0 {
            return Ok(head);
        }
        let room = keep - head.len();
        head.extend_from_slice(&buf[..n.min(room)]);
    }
}

/// A child in its own process group; dropping it kills the group unless the child was
/// reaped, which only happens after it exited and its pipes closed.
struct Group(Child);

impl Drop for Group {
    fn drop(&mut self) {
        // `id` is None once the child has been reaped: its pid may then belong to someone
        // else, so nothing is sent.
        if let Some(pid) = self.0.id() {
            if let Ok(pid) = libc::pid_t::try_from(pid) {
                // SAFETY: kill has no memory-safety preconditions; the negative pid names
                // the process group the child leads (`process_group(0)`).
                unsafe {
                    libc::kill(-pid, libc::SIGKILL);
                }
            }
        }
        // The Child's own kill_on_drop then kills the leader again (harmless) and hands
        // it to tokio to be reaped.
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;

    fn spec(command: &[&str]) -> ExecSpec {
        ExecSpec {
            command: command.iter().map(|s| s.to_string()).collect(),
            timeout_secs: default_timeout_secs(),
            max_output: default_max_output(),
            memory: default_memory(),
            concurrency: None,
            env: BTreeMap::new(),
        }
    }

    /// Whether `pid` is gone or a zombie (killed, not yet reaped by whoever inherited it).
    fn dead(pid: u32) -> bool {
        match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            Err(_) => true,
            // The state follows the parenthesised command name.
            Ok(stat) => stat
                .rsplit_once(')')
                .is_some_and(|(_, rest)| rest.trim_start().starts_with(['Z', 'X'])),
        }
    }

    async fn wait_dead(pid: u32) {
        let start = Instant::now();
        while !dead(pid) {
            assert!(
                start.elapsed() < Duration::from_secs(5),
                "pid {pid} lives on"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn read_pid(path: &std::path::Path) -> u32 {
        let start = Instant::now();
        loop {
            if let Ok(s) = std::fs::read_to_string(path) {
                if let Ok(pid) = s.trim().parse() {
                    return pid;
                }
            }
            assert!(start.elapsed() < Duration::from_secs(5), "no pid file");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    #[tokio::test]
    async fn cat_echoes_its_input() {
        let input: Vec<u8> = (0..1024 * 1024u32)
            .map(|i| (i * 7 + i / 251) as u8)
            .collect();
        let out = run(&spec(&["cat"]), Bytes::from(input.clone()))
            .await
            .unwrap();
        assert_eq!(out.len(), input.len());
        assert_eq!(out, input);
        let out = run(&spec(&["cat"]), Bytes::new()).await.unwrap();
        assert!(out.is_empty());
    }

    #[tokio::test]
    async fn large_input_and_output_do_not_deadlock() {
        // 16 MiB each way, well past any pipe buffer, with stderr chatter on the side.
        let input = Bytes::from(vec![b'x'; 16 << 20]);
        let s = spec(&["sh", "-c", "cat; head -c 100000 /dev/zero >&2"]);
        let out = run(&s, input.clone()).await.unwrap();
        assert_eq!(out, input);
    }

    #[tokio::test]
    async fn nonzero_exit_is_failed_with_stderr() {
        let err = run(&spec(&["sh", "-c", "echo oops >&2; exit 3"]), Bytes::new())
            .await
            .unwrap_err();
        match err {
            ExecError::Failed { status, stderr } => {
                assert!(status.contains('3'), "{status}");
                assert_eq!(stderr, "oops\n");
            }
            other => panic!("expected Failed, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn stderr_is_cut_at_4_kib() {
        let s = spec(&[
            "sh",
            "-c",
            "head -c 1000000 /dev/zero | tr '\\0' e >&2; exit 1",
        ]);
        match run(&s, Bytes::new()).await.unwrap_err() {
            ExecError::Failed { stderr, .. } => assert_eq!(stderr, "e".repeat(STDERR_KEPT)),
            other => panic!("expected Failed, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn killed_by_a_signal_is_failed() {
        let err = run(&spec(&["sh", "-c", "kill -9 $$"]), Bytes::new())
            .await
            .unwrap_err();
        match err {
            ExecError::Failed { status, .. } => assert!(status.contains('9'), "{status}"),
            other => panic!("expected Failed, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn timeout_kills_the_program() {
        let s = ExecSpec {
            timeout_secs: 0.5,
            ..spec(&["sleep", "30"])
        };
        let start = Instant::now();
        let err = run(&s, Bytes::new()).await.unwrap_err();
        assert!(matches!(err, ExecError::Timeout(t) if t == 0.5), "{err:?}");
        assert!(
            start.elapsed() < Duration::from_secs(2),
            "{:?}",
            start.elapsed()
        );
    }

    #[tokio::test]
    async fn timeout_kills_the_whole_process_group() {
        let dir = tempfile::tempdir().unwrap();
        let pidfile = dir.path().join("pid");
        // The background sleep keeps stdout open after its shell is gone.
        let script = format!("sleep 30 & echo $! > {}; wait", pidfile.display());
        let s = ExecSpec {
            timeout_secs: 0.5,
            ..spec(&["sh", "-c", &script])
        };
        let err = run(&s, Bytes::new()).await.unwrap_err();
        assert!(matches!(err, ExecError::Timeout(_)), "{err:?}");
        wait_dead(read_pid(&pidfile).await).await;
    }

    #[tokio::test]
    async fn dropping_the_future_kills_the_process_group() {
        let dir = tempfile::tempdir().unwrap();
        let pidfile = dir.path().join("pid");
        let script = format!("sleep 30 & echo $! > {}; wait", pidfile.display());
        let s = spec(&["sh", "-c", &script]);
        let fut = run(&s, Bytes::new());
        assert!(tokio::time::timeout(Duration::from_millis(300), fut)
            .await
            .is_err());
        wait_dead(read_pid(&pidfile).await).await;
    }

    #[tokio::test]
    async fn too_much_output_is_stopped_early() {
        let s = ExecSpec {
            max_output: 1 << 20,
            ..spec(&["yes"])
        };
        let start = Instant::now();
        let err = run(&s, Bytes::new()).await.unwrap_err();
        assert!(
            matches!(err, ExecError::TooMuchOutput(m) if m == 1 << 20),
            "{err:?}"
        );
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "{:?}",
            start.elapsed()
        );
        // Exactly at the limit is fine.
        let s = ExecSpec {
            max_output: 1000,
            ..spec(&["head", "-c", "1000", "/dev/zero"])
        };
        assert_eq!(run(&s, Bytes::new()).await.unwrap(), vec![0u8; 1000]);
    }

    #[tokio::test]
    async fn missing_program_is_a_spawn_error() {
        let err = run(
            &spec(&["/nonexistent/granary-no-such-program"]),
            Bytes::new(),
        )
        .await
        .unwrap_err();
        assert!(matches!(err, ExecError::Spawn(_)), "{err:?}");
        let err = run(&spec(&[]), Bytes::new()).await.unwrap_err();
        assert!(matches!(err, ExecError::Spawn(_)), "{err:?}");
    }

    #[tokio::test]
    async fn unread_input_with_a_clean_exit_is_fine() {
        let out = run(&spec(&["true"]), Bytes::from(vec![7u8; 8 << 20]))
            .await
            .unwrap();
        assert!(out.is_empty());
    }

    #[tokio::test]
    async fn environment_is_cleared_but_path_and_extras() {
        let mut s = spec(&["sh", "-c", "echo \"$PATH|$GRANARY_TEST|$HOME\""]);
        s.env.insert("GRANARY_TEST".to_string(), "yes".to_string());
        let out = run(&s, Bytes::new()).await.unwrap();
        let path = std::env::var("PATH").unwrap_or_default();
        assert_eq!(String::from_utf8(out).unwrap(), format!("{path}|yes|\n"));
    }

    #[tokio::test]
    async fn memory_limit_stops_a_large_allocation() {
        let mut s = spec(&["python3", "-c", "print(len(bytearray(1024)))"]);
        s.memory = 512 << 20;
        // pyenv-style shims look for HOME.
        if let Ok(home) = std::env::var("HOME") {
            s.env.insert("HOME".to_string(), home);
        }
        match run(&s, Bytes::new()).await {
            Ok(out) if out == b"1024\n" => {}
            other => {
                crate::testing::skipped(&format!(
                    "python3 does not run under the limit here: {other:?}"
                ));
                return;
            }
        }
        s.command[2] = "x = bytearray(2 * 1024**3)".to_string();
        match run(&s, Bytes::new()).await.unwrap_err() {
            ExecError::Failed { stderr, .. } => {
                assert!(stderr.contains("MemoryError"), "{stderr}")
            }
            other => panic!("expected Failed, got {other:?}"),
        }
        // The same allocation succeeds without the limit.
        s.memory = 0;
        s.command[2] = "x = bytearray(64 * 1024**2); print(len(x))".to_string();
        assert_eq!(run(&s, Bytes::new()).await.unwrap(), b"67108864\n");
    }

    #[test]
    fn validate_and_defaults() {
        let s: ExecSpec = serde_json::from_str(r#"{"command": ["cat"]}"#).unwrap();
        assert_eq!(s, spec(&["cat"]));
        assert_eq!(s.timeout_secs, 30.0);
        assert_eq!(s.max_output, 256 << 20);
        assert_eq!(s.memory, 4 << 30);
        assert!(s.validate().is_ok());
        assert!(concurrency(&s) >= 1);
        assert_eq!(
            concurrency(&ExecSpec {
                concurrency: Some(3),
                ..s.clone()
            }),
            3
        );
        assert!(
            serde_json::from_str::<ExecSpec>(r#"{"command": ["cat"], "shell": true}"#).is_err()
        );
        assert!(serde_json::from_str::<ExecSpec>("{}").is_err());

        let bad = |f: &dyn Fn(&mut ExecSpec)| {
            let mut s = spec(&["cat"]);
            f(&mut s);
            s.validate().is_err()
        };
        assert!(bad(&|s| s.command.clear()));
        assert!(bad(&|s| s.command[0].clear()));
        assert!(bad(&|s| s.command.push("a\0b".to_string())));
        assert!(bad(&|s| s.timeout_secs = 0.0));
        assert!(bad(&|s| s.timeout_secs = -1.0));
        assert!(bad(&|s| s.timeout_secs = f64::NAN));
        assert!(bad(&|s| s.timeout_secs = f64::INFINITY));
        assert!(bad(&|s| s.concurrency = Some(0)));
        assert!(bad(&|s| {
            s.env.insert("A=B".to_string(), "x".to_string());
        }));
        assert!(bad(&|s| {
            s.env.insert(String::new(), "x".to_string());
        }));
        assert!(!bad(&|s| {
            s.env.insert("A".to_string(), String::new());
        }));
    }
}
