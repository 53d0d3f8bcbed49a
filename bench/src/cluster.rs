//! A cluster of real `granary` processes that the bench starts and changes while it
//! measures: members listed in a peers file (`--peers-file`) the bench rewrites whole
//! (write, then rename, as a ConfigMap update lands), each member with its own data
//! directory and log under one directory; members killed (`SIGKILL`) and restarted,
//! joined and removed.

use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use granary_client::Client;

/// How to start members.
#[derive(Debug, Clone)]
pub struct ClusterCmd {
    /// The `granary` binary.
    pub binary: PathBuf,
    /// Arguments every member gets (the backend, the cache capacity…).
    pub args: Vec<String>,
    /// Data directories, the peers file and the logs go under it.
    pub dir: PathBuf,
}

struct Member {
    id: String,
    addr: SocketAddr,
    child: Option<Child>,
}

/// The members, started by [`Cluster::start`]; all killed on drop.
pub struct Cluster {
    cmd: ClusterCmd,
    members: Vec<Member>,
    /// Indexes of the members in the peers file.
    listed: Vec<usize>,
}

/// How long a member is given to answer health after it starts.
const START_TIMEOUT: Duration = Duration::from_secs(30);

fn free_addr() -> anyhow::Result<SocketAddr> {
    let l = TcpListener::bind("127.0.0.1:0").context("a free loopback port")?;
    Ok(l.local_addr()?)
}

impl Cluster {
    /// `n` members, `g0`…, listed and started; returns once each answers health.
    pub fn start(cmd: ClusterCmd, n: usize) -> anyhow::Result<Cluster> {
        std::fs::create_dir_all(&cmd.dir)
            .with_context(|| format!("creating {}", cmd.dir.display()))?;
        let mut c = Cluster {
            cmd,
            members: Vec::new(),
            listed: Vec::new(),
        };
        for _ in 0..n {
            let i = c.add()?;
            c.listed.push(i);
        }
        c.write_list()?;
        for i in 0..n {
            c.spawn(i)?;
        }
        for i in 0..n {
            c.wait_healthy(i)?;
        }
        Ok(c)
    }

    fn add(&mut self) -> anyhow::Result<usize> {
        let i = self.members.len();
        self.members.push(Member {
            id: format!("g{i}"),
            addr: free_addr()?,
            child: None,
        });
        Ok(i)
    }

    fn peers_path(&self) -> PathBuf {
        self.cmd.dir.join("peers")
    }

    fn write_list(&self) -> anyhow::Result<()> {
        let text: String = self
            .listed
            .iter()
            .map(|&i| format!("{}=http://{}\n", self.members[i].id, self.members[i].addr))
            .collect();
        let tmp = self.cmd.dir.join("peers.tmp");
        std::fs::write(&tmp, text)?;
        std::fs::rename(&tmp, self.peers_path())?;
        Ok(())
    }

    fn spawn(&mut self, i: usize) -> anyhow::Result<()> {
        let m = &self.members[i];
        let data = self.cmd.dir.join(&m.id);
        std::fs::create_dir_all(&data)?;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.cmd.dir.join(format!("{}.log", m.id)))?;
        let child = Command::new(&self.cmd.binary)
            .arg("serve")
            .args(&self.cmd.args)
            .args(["--node-id", &m.id, "--listen", &m.addr.to_string()])
            .arg("--data-dir")
            .arg(&data)
            .arg("--peers-file")
            .arg(self.peers_path())
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {}", self.cmd.binary.display()))?;
        self.members[i].child = Some(child);
        Ok(())
    }

    fn wait_healthy(&mut self, i: usize) -> anyhow::Result<()> {
        let deadline = Instant::now() + START_TIMEOUT;
        let mut c = Client::new(&self.endpoint(i))?.with_timeout(Duration::from_secs(2));
        loop {
            if c.health().is_ok() {
                return Ok(());
            }
            if let Some(status) = self.members[i]
                .child
                .as_mut()
                .and_then(|ch| ch.try_wait().ok().flatten())
            {
                bail!("member {} exited with {status}", self.members[i].id);
            }
            if Instant::now() > deadline {
                bail!(
                    "member {} did not answer health within {START_TIMEOUT:?}",
                    self.members[i].id
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `http://ADDR` of member `i`.
    pub fn endpoint(&self, i: usize) -> String {
        format!("http://{}", self.members[i].addr)
    }

    /// Member `i`'s id.
    pub fn id(&self, i: usize) -> &str {
        &self.members[i].id
    }

    /// The members running now.
    pub fn running(&self) -> Vec<usize> {
        (0..self.members.len())
            .filter(|&i| self.members[i].child.is_some())
            .collect()
    }

    /// Kills member `i` with `SIGKILL`.
    pub fn kill(&mut self, i: usize) -> anyhow::Result<()> {
        if let Some(mut child) = self.members[i].child.take() {
            child.kill()?;
            child.wait()?;
        }
        Ok(())
    }

    /// Starts member `i` again (same data directory); returns once it answers health.
    pub fn restart(&mut self, i: usize) -> anyhow::Result<()> {
        self.kill(i)?;
        self.spawn(i)?;
        self.wait_healthy(i)
    }

    /// A new member: listed in the file, then started; its index once it answers health.
    pub fn join(&mut self) -> anyhow::Result<usize> {
        let i = self.add()?;
        self.listed.push(i);
        self.write_list()?;
        self.spawn(i)?;
        self.wait_healthy(i)?;
        Ok(i)
    }

    /// Member `i` leaves: out of the file; once every other running member's view has
    /// dropped it (within `timeout`), stopped. How long the views took.
    pub fn remove(&mut self, i: usize, timeout: Duration) -> anyhow::Result<Duration> {
        self.listed.retain(|&j| j != i);
        self.write_list()?;
        let started = Instant::now();
        let id = self.members[i].id.clone();
        for j in self.running().into_iter().filter(|&j| j != i) {
            let mut c = Client::new(&self.endpoint(j))?.with_timeout(Duration::from_secs(2));
            loop {
                let gone = c
                    .cluster()
                    .map(|v| v.members.iter().all(|m| m.id != id))
                    .unwrap_or(false);
                if gone {
                    break;
                }
                if started.elapsed() > timeout {
                    bail!("{} still lists {id} after {timeout:?}", self.members[j].id);
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        let took = started.elapsed();
        self.kill(i)?;
        Ok(took)
    }

    /// A counter of member `i`'s `/_granary/stats`.
    pub fn stat(&self, i: usize, field: &str) -> anyhow::Result<u64> {
        let stats = Client::new(&self.endpoint(i))?
            .with_timeout(Duration::from_secs(5))
            .stats()
            .with_context(|| format!("stats of {}", self.members[i].id))?;
        Ok(stats[field].as_u64().unwrap_or(0))
    }

    /// A counter of `/_granary/stats`, summed over the running members.
    pub fn stat_sum(&self, field: &str) -> anyhow::Result<u64> {
        let mut sum = 0;
        for i in self.running() {
            sum += self.stat(i, field)?;
        }
        Ok(sum)
    }

    /// The rebalance jobs of every running member, as `/_granary/jobs` lists them.
    pub fn rebalance_jobs(&self) -> anyhow::Result<Vec<serde_json::Value>> {
        let mut out = Vec::new();
        for i in self.running() {
            let mut c = Client::new(&self.endpoint(i))?.with_timeout(Duration::from_secs(5));
            let resp = c.raw("GET", "/_granary/jobs", b"")?;
            let jobs: serde_json::Value = serde_json::from_slice(&resp.body)?;
            out.extend(
                jobs.as_array()
                    .into_iter()
                    .flatten()
                    .filter(|j| j["kind"] == "rebalance")
                    .cloned(),
            );
        }
        Ok(out)
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for m in &mut self.members {
            if let Some(mut child) = m.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}
