//! A private throwaway PostgreSQL cluster: `initdb` + `pg_ctl` of the installed server
//! binaries, in a temporary directory, on a free loopback port, stopped and removed when
//! dropped. The demo falls back to one when nothing answers at `DATABASE_URL`; the chaos
//! benchmark and its test run on one so they may restart it and take it down (never the
//! shared server).

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::Context;

/// The newest `/usr/lib/postgresql/<version>/bin` holding `initdb` and `pg_ctl`.
pub fn server_binaries() -> Option<PathBuf> {
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let version = e.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = e.path().join("bin");
            (bin.join("initdb").is_file() && bin.join("pg_ctl").is_file()).then_some((version, bin))
        })
        .collect();
    found.sort();
    found.pop().map(|(_, bin)| bin)
}

/// A throwaway PostgreSQL cluster in a temporary directory, stopped and removed on drop.
pub struct Cluster {
    /// `pg_ctl` of the installation that created it.
    pg_ctl: PathBuf,
    /// The directory holding the data directory, the log and the unix socket; removed on
    /// drop.
    pub dir: PathBuf,
    /// The loopback port it listens on.
    pub port: u16,
    /// Whether its commands run as the `postgres` user (PostgreSQL refuses to run as root).
    as_postgres: bool,
    /// Whether to say on stdout that it was stopped and removed.
    chatty: bool,
}

impl Cluster {
    /// Creates and starts a cluster with the server binaries in `bin` (see
    /// [`server_binaries`]). Blocking: call it from `spawn_blocking` in async code.
    pub fn start(bin: &Path) -> anyhow::Result<Self> {
        let as_postgres = Command::new("id")
            .arg("-u")
            .output()
            .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0");
        let dir = std::env::temp_dir().join(format!(
            "courier-pg-{}-{:08x}",
            std::process::id(),
            rand::random::<u32>()
        ));
        std::fs::create_dir_all(&dir)?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let cluster = Self {
            pg_ctl: bin.join("pg_ctl"),
            dir: dir.clone(),
            port,
            as_postgres,
            chatty: true,
        };
        if as_postgres {
            run_command(Command::new("chown").arg("postgres").arg(&dir))?;
        }
        run_command(
            cluster
                .command(&bin.join("initdb"))
                .args(["-U", "postgres", "--auth=trust", "-E", "UTF8", "-D"])
                .arg(cluster.data()),
        )?;
        cluster.start_again()?;
        Ok(cluster)
    }

    /// Says nothing on stdout when dropped (for tests).
    pub fn quiet(mut self) -> Self {
        self.chatty = false;
        self
    }

    /// The URL of its `postgres` database.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    fn data(&self) -> PathBuf {
        self.dir.join("data")
    }

    /// Starts the stopped cluster and waits until it accepts connections. Blocking.
    pub fn start_again(&self) -> anyhow::Result<()> {
        run_command(
            self.command(&self.pg_ctl)
                .arg("-D")
                .arg(self.data())
                .arg("-l")
                .arg(self.dir.join("log"))
                .arg("-o")
                .arg(format!(
                    "-p {} -c listen_addresses=127.0.0.1 -k {}",
                    self.port,
                    self.dir.display()
                ))
                .args(["-w", "start"]),
        )
    }

    /// Stops it (fast shutdown: sessions are disconnected, nothing waits for clients) and
    /// waits until it is down. Blocking.
    pub fn stop(&self) -> anyhow::Result<()> {
        run_command(
            self.command(&self.pg_ctl)
                .arg("-D")
                .arg(self.data())
                .args(["-m", "fast", "-w", "stop"]),
        )
    }

    /// Restarts it (fast shutdown, then start: what `pg_ctl restart` does, with the log
    /// file and options of [`Cluster::start_again`]) and waits until it accepts
    /// connections again. Blocking.
    pub fn restart(&self) -> anyhow::Result<()> {
        self.stop()?;
        self.start_again()
    }

    fn command(&self, program: &Path) -> Command {
        if self.as_postgres {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(program);
            c
        } else {
            Command::new(program)
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // Already stopped is fine: only the removal matters then.
        let _ = self
            .command(&self.pg_ctl)
            .arg("-D")
            .arg(self.data())
            .args(["-m", "immediate", "-w", "stop"])
            .output();
        match std::fs::remove_dir_all(&self.dir) {
            Ok(()) if self.chatty => {
                println!("private cluster stopped and {} removed", self.dir.display())
            }
            Ok(()) => {}
            Err(e) => eprintln!("courier: could not remove {}: {e}", self.dir.display()),
        }
    }
}

/// Runs a command, failing with its output when it fails.
pub fn run_command(cmd: &mut Command) -> anyhow::Result<()> {
    let out = cmd
        .output()
        .with_context(|| format!("running {:?}", cmd.get_program()))?;
    anyhow::ensure!(
        out.status.success(),
        "{:?} failed: {}{}",
        cmd.get_program(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}
