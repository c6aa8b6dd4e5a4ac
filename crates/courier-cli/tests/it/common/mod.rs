//! Helpers of the command line's tests: the engine's own test helpers (one copy, in the
//! repository's `tests/it/common`), and the `courier` binary under test.

#![allow(dead_code)]

#[path = "../../../../../tests/it/common/mod.rs"]
mod engine;

pub use engine::*;

/// The `courier` binary cargo built for these tests. Its workers serve no metrics unless
/// a test sets `COURIER_HTTP_ADDR` (tests run in parallel; the default port is one).
pub fn courier() -> std::process::Command {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_courier"));
    command.env("COURIER_HTTP_ADDR", "");
    command
}

/// The binary on database `url`, its log at the default level (whatever the environment
/// the tests run in sets): the start of nearly every command a test runs.
pub fn courier_on(url: &str) -> std::process::Command {
    let mut command = courier();
    command.env("DATABASE_URL", url).env_remove("COURIER_LOG");
    command
}

/// A `courier worker` on database `url` with `env` set, its output discarded, killed
/// (SIGKILL) when the test lets it go or fails half-way.
pub fn worker_process(url: &str, env: &[(&str, &str)]) -> Killed {
    let mut command = courier_on(url);
    command.arg("worker").envs(env.iter().copied());
    let child = command
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("courier worker starts");
    Killed(Some(child))
}

/// A child process, killed with SIGKILL by [`Killed::kill`] or when dropped.
pub struct Killed(Option<std::process::Child>);

impl Killed {
    /// Kills the process (SIGKILL) and reaps it.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Killed {
    fn drop(&mut self) {
        self.kill();
    }
}

/// What a run of the binary gave.
pub struct Ran {
    /// Whether it exited 0.
    pub ok: bool,
    /// Its exit code.
    pub code: Option<i32>,
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
}

impl Ran {
    /// Standard output and standard error, in that order.
    pub fn both(&self) -> String {
        format!("{}{}", self.stdout, self.stderr)
    }
}

/// Runs `command` to its end.
pub fn ran(command: &mut std::process::Command) -> Ran {
    let out = command.output().expect("the courier binary runs");
    Ran {
        ok: out.status.success(),
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Runs the binary on database `url` with `args`.
pub fn run_on(url: &str, args: &[&str]) -> Ran {
    ran(courier_on(url).args(args))
}
