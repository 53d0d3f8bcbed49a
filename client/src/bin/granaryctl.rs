//! `granaryctl`: the command-line client of a Granary node — objects (ls, get, put, stat,
//! rm), cache warming (prefetch, jobs), the cluster view, and batch reads.

use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand, ValueEnum};
use granary_client::{format_time, BatchItem, Client, GetOptions, Job, JobState, Missing};

#[derive(Parser)]
#[command(
    name = "granaryctl",
    version,
    about = "Command-line client for Granary nodes"
)]
struct Cli {
    /// The node to talk to.
    #[arg(
        long,
        env = "GRANARY_ENDPOINT",
        default_value = "http://127.0.0.1:7070",
        global = true
    )]
    endpoint: String,
    /// Access key to sign requests with (SigV4); unsigned without one.
    #[arg(long, env = "AWS_ACCESS_KEY_ID", global = true, hide_env_values = true)]
    access_key: Option<String>,
    /// Secret key to sign requests with.
    #[arg(
        long,
        env = "AWS_SECRET_ACCESS_KEY",
        global = true,
        hide_env_values = true
    )]
    secret_key: Option<String>,
    /// Region the signatures are scoped to.
    #[arg(long, env = "AWS_REGION", default_value = "us-east-1", global = true)]
    region: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Check that the node serves (exit status 0 when it does).
    Health,
    /// Print the node's counters as JSON.
    Stats,
    /// Print the cluster's members and their state.
    Cluster {
        /// Also name the member that owns this object (`BUCKET/KEY`).
        #[arg(long, value_name = "BUCKET/KEY")]
        owner: Option<String>,
        /// Print the view as JSON.
        #[arg(long)]
        json: bool,
    },
    /// List buckets, or the objects under `BUCKET[/PREFIX]` (key, size, ETag per line).
    Ls {
        /// `BUCKET` or `BUCKET/PREFIX`; none lists the buckets.
        target: Option<String>,
    },
    /// Create a bucket.
    Mb { bucket: String },
    /// Download an object (`BUCKET/KEY`) to standard output.
    Cat {
        /// `BUCKET/KEY`
        object: String,
        /// Only this member of a tar shard.
        #[arg(long)]
        archpath: Option<String>,
    },
    /// Download an object to a file (`-`: standard output; default: the key's file name).
    Get {
        /// `BUCKET/KEY`
        object: String,
        file: Option<PathBuf>,
        /// Only this member of a tar shard.
        #[arg(long)]
        archpath: Option<String>,
    },
    /// Upload a file as an object (a key ending in `/` takes the file's name).
    Put {
        file: PathBuf,
        /// `BUCKET/KEY`
        object: String,
    },
    /// Print an object's size, ETag, dates and where Granary holds it.
    Stat {
        /// `BUCKET/KEY`
        object: String,
        /// Print as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Drain a member (`NODE`, its id): it hands every copy it holds to the members
    /// that own them without it, then takes no new fills. Follows it until it is drained
    /// (a bar in a terminal); it may then be stopped and taken out of the member list.
    Drain {
        /// The member's `--node-id`.
        node: String,
        /// Print its state and return at once.
        #[arg(long)]
        no_wait: bool,
        /// How often to look, in milliseconds.
        #[arg(long, default_value_t = 500)]
        interval_ms: u64,
        /// End the member's drain instead: it serves its keys again, and the others
        /// hand it back their copies of them.
        #[arg(long)]
        undo: bool,
    },
    /// Delete an object.
    Rm {
        /// `BUCKET/KEY`
        object: String,
    },
    /// Warm the cluster's cache with every object under `BUCKET[/PREFIX]`, following the
    /// job until it ends (exit status 1 when it fails or is cancelled).
    Prefetch {
        /// `BUCKET` or `BUCKET/PREFIX`
        target: String,
        /// Print the job id and return at once.
        #[arg(long)]
        no_wait: bool,
        /// How often to poll the job, in milliseconds.
        #[arg(long, default_value_t = 500)]
        interval_ms: u64,
    },
    /// Show a job (`job ID`), follow it (`job wait ID`) or cancel it (`job cancel ID`).
    Job(JobArgs),
    /// Write the index of the dataset under `BUCKET/PREFIX` (`PREFIXwids.json`,
    /// WebDataset's wids shard list: each shard and its samples), counted by the cluster
    /// from the shards themselves; a job then starts without reading any shard.
    Index {
        /// `BUCKET/PREFIX` (a prefix ending in `/` names a folder of shards)
        target: String,
    },
    /// The jobs' plans the cluster holds: a line each, with the epoch's progress (a bar
    /// in a terminal), the bytes fetched ahead and dropped, and reads found ready.
    Plans {
        /// Print them as JSON.
        #[arg(long)]
        json: bool,
        /// Drop this plan cluster-wide instead (its fetching stops).
        #[arg(long, value_name = "ID")]
        drop: Option<String>,
    },
    /// Read many objects and shard members as one tar stream (GetBatch).
    Batch {
        /// Items, one `BUCKET/KEY[#ARCHPATH]` a line, or a JSON array of
        /// `{"bucket","key","archpath"?}`; `-` or none: standard input.
        items: Option<PathBuf>,
        /// Where to write the tar (`-` or none: standard output).
        #[arg(short, long)]
        output: Option<PathBuf>,
        /// What a missing item does: fail the batch, or become an empty `__404__/NAME`.
        #[arg(long, value_enum, default_value_t = MissingArg::Error)]
        missing: MissingArg,
    },
}

#[derive(Args)]
#[command(args_conflicts_with_subcommands = true)]
struct JobArgs {
    #[command(subcommand)]
    action: Option<JobAction>,
    /// The job to show.
    id: Option<String>,
    /// Print as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Subcommand)]
enum JobAction {
    /// Follow a job with a progress bar until it ends.
    Wait {
        id: String,
        #[arg(long, default_value_t = 500)]
        interval_ms: u64,
    },
    /// Cancel a job.
    Cancel { id: String },
}

#[derive(Clone, Copy, ValueEnum)]
enum MissingArg {
    Error,
    Mark,
}

/// `BUCKET/KEY` split; the key may be empty only where `key_optional`.
fn split_object(s: &str, key_optional: bool) -> Result<(String, String)> {
    let s = s.strip_prefix("s3://").unwrap_or(s).trim_start_matches('/');
    let (bucket, key) = s.split_once('/').unwrap_or((s, ""));
    if bucket.is_empty() || (!key_optional && key.is_empty()) {
        bail!("expected BUCKET/KEY, got `{s}`");
    }
    Ok((bucket.to_owned(), key.to_owned()))
}

fn client(cli: &Cli) -> Result<Client> {
    let client = Client::new(&cli.endpoint)?;
    Ok(match (&cli.access_key, &cli.secret_key) {
        (Some(a), Some(s)) => client.with_credentials(a, s, &cli.region),
        (None, None) => client,
        _ => bail!("give both an access key and a secret key, or neither"),
    })
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(&cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("granaryctl: {}", describe(&e));
            ExitCode::FAILURE
        }
    }
}

/// The error and its causes, each said once (a cause its parent already quotes is left out).
fn describe(e: &anyhow::Error) -> String {
    let mut msg = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if msg.contains(&text) {
            continue;
        }
        if !msg.is_empty() {
            msg.push_str(": ");
        }
        msg.push_str(&text);
    }
    msg
}

fn run(cli: &Cli) -> Result<ExitCode> {
    let mut client = client(cli)?;
    match &cli.command {
        Command::Health => println!("{}", client.health()?),
        Command::Stats => println!("{:#}", client.stats()?),
        Command::Cluster { owner, json } => cluster(&mut client, owner.as_deref(), *json)?,
        Command::Ls { target } => ls(&mut client, target.as_deref())?,
        Command::Mb { bucket } => client.create_bucket(bucket)?,
        Command::Cat { object, archpath } => {
            let (bucket, key) = split_object(object, false)?;
            let opts = GetOptions {
                archpath: archpath.clone(),
                ..GetOptions::default()
            };
            let mut out = std::io::stdout().lock();
            client.get_with_into(&bucket, &key, &opts, &mut out)?;
            out.flush()?;
        }
        Command::Get {
            object,
            file,
            archpath,
        } => get(&mut client, object, file.as_deref(), archpath.clone())?,
        Command::Put { file, object } => put(&mut client, file, object)?,
        Command::Stat { object, json } => stat(&mut client, object, *json)?,
        Command::Rm { object } => {
            let (bucket, key) = split_object(object, false)?;
            client.delete(&bucket, &key)?;
        }
        Command::Prefetch {
            target,
            no_wait,
            interval_ms,
        } => {
            let (bucket, prefix) = split_object(target, true)?;
            let id = client.prefetch(&bucket, &prefix)?;
            if *no_wait {
                println!("{id}");
                return Ok(ExitCode::SUCCESS);
            }
            eprintln!("prefetch job {id} started");
            return follow(&mut client, &id, *interval_ms);
        }
        Command::Job(args) => return job(&mut client, args),
        Command::Index { target } => index(&mut client, target)?,
        Command::Drain {
            node,
            no_wait: _,
            interval_ms: _,
            undo: true,
        } => println!("{node}: {}", client.undrain(node)?.as_str()),
        Command::Drain {
            node,
            no_wait,
            interval_ms,
            undo: false,
        } => drain(&mut client, node, *no_wait, *interval_ms)?,
        Command::Plans { json, drop } => plans(&mut client, *json, drop.as_deref())?,
        Command::Batch {
            items,
            output,
            missing,
        } => batch(&mut client, items.as_deref(), output.as_deref(), *missing)?,
    }
    Ok(ExitCode::SUCCESS)
}

fn cluster(client: &mut Client, owner: Option<&str>, json: bool) -> Result<()> {
    let view = match owner {
        Some(o) => {
            let (bucket, key) = split_object(o, false)?;
            client.owner_of(&bucket, &key)?
        }
        None => client.cluster()?,
    };
    if json {
        let members: Vec<_> = view
            .members
            .iter()
            .map(|m| {
                let mut j = serde_json::json!({"id": m.id, "url": m.url, "state": m.state.as_str(), "weight": m.weight});
                if let Some(h) = &m.handover {
                    j["handover"] = serde_json::json!({
                        "running": h.running,
                        "objects_done": h.objects_done,
                        "objects_total": h.objects_total,
                        "bytes_done": h.bytes_done,
                        "bytes_total": h.bytes_total,
                    });
                }
                j
            })
            .collect();
        let mut v = serde_json::json!({"node_id": view.node_id, "members": members});
        if let Some(o) = &view.owner {
            v["owner"] = serde_json::json!(o);
        }
        println!("{v:#}");
        return Ok(());
    }
    let id_w = view
        .members
        .iter()
        .map(|m| m.id.len())
        .max()
        .unwrap_or(0)
        .max(2);
    let url_w = view
        .members
        .iter()
        .map(|m| m.url.len())
        .max()
        .unwrap_or(0)
        .max(3);
    let bars = std::io::IsTerminal::is_terminal(&std::io::stdout());
    println!(
        "  {:id_w$}  {:url_w$}  {:8}  {:>14}  HANDOVER",
        "ID", "URL", "STATE", "WEIGHT"
    );
    for m in &view.members {
        let me = if m.id == view.node_id { "*" } else { " " };
        println!(
            "{me} {:id_w$}  {:url_w$}  {:8}  {:>14}  {}",
            m.id,
            m.url,
            m.state.as_str(),
            m.weight,
            m.handover
                .as_ref()
                .map_or_else(|| "-".to_owned(), |h| handover(h, bars))
        );
    }
    if let Some(o) = &view.owner {
        println!("owner: {o}");
    }
    Ok(())
}

/// `done` of 1 as a bar of 20 (in a terminal) and a percentage.
fn text_bar(done: f64, bars: bool) -> String {
    let done = done.clamp(0.0, 1.0);
    if !bars {
        return format!("{:.0}%", done * 100.0);
    }
    let filled = (done * 20.0).round() as usize;
    format!(
        "[{}{}] {:>3.0}%",
        "#".repeat(filled),
        ".".repeat(20 - filled),
        done * 100.0
    )
}

/// A member's hand-over: how much of its copies went to their owners.
fn handover(h: &granary_client::Handover, bars: bool) -> String {
    let done = if h.bytes_total > 0 {
        h.bytes_done as f64 / h.bytes_total as f64
    } else {
        1.0
    };
    format!(
        "{} {}/{} objects, {}/{}{}",
        text_bar(done, bars),
        h.objects_done,
        h.objects_total,
        indicatif::HumanBytes(h.bytes_done),
        indicatif::HumanBytes(h.bytes_total),
        if h.running { "" } else { " (ended)" }
    )
}

/// Drains member `node`, following it (unless `no_wait`) until it says it is drained.
fn drain(client: &mut Client, node: &str, no_wait: bool, interval_ms: u64) -> Result<()> {
    let state = client.drain(node)?;
    if no_wait {
        println!("{node}: {}", state.as_str());
        return Ok(());
    }
    let bar = indicatif::ProgressBar::new(0);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {wide_bar} {bytes}/{total_bytes} ({bytes_per_sec}) {msg}",
        )
        .expect("a valid template"),
    );
    loop {
        let view = client.cluster()?;
        let m = view
            .members
            .iter()
            .find(|m| m.id == node)
            .with_context(|| format!("the cluster no longer lists `{node}`"))?;
        if let Some(h) = &m.handover {
            bar.set_length(h.bytes_total.max(h.bytes_done));
            bar.set_position(h.bytes_done);
            bar.set_message(format!(
                "{}: {}/{} objects",
                m.state.as_str(),
                h.objects_done,
                h.objects_total
            ));
        } else {
            bar.set_message(m.state.as_str());
        }
        if m.state == granary_client::MemberState::Drained {
            bar.finish_and_clear();
            println!("{node}: drained; it may be stopped and taken out of the member list");
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(interval_ms.max(10)));
    }
}

fn ls(client: &mut Client, target: Option<&str>) -> Result<()> {
    let mut out = BufWriter::new(std::io::stdout().lock());
    match target {
        None => {
            for b in client.list_buckets()? {
                writeln!(out, "{b}")?;
            }
        }
        Some(t) => {
            let (bucket, prefix) = split_object(t, true)?;
            for o in client.list(&bucket, &prefix)? {
                writeln!(out, "{}\t{}\t{}", o.key, o.size, o.etag)?;
            }
        }
    }
    out.flush()?;
    Ok(())
}

fn get(
    client: &mut Client,
    object: &str,
    file: Option<&Path>,
    archpath: Option<String>,
) -> Result<()> {
    let (bucket, key) = split_object(object, false)?;
    let opts = GetOptions {
        archpath,
        ..GetOptions::default()
    };
    let path = match file {
        Some(p) if p == Path::new("-") => {
            let mut out = std::io::stdout().lock();
            client.get_with_into(&bucket, &key, &opts, &mut out)?;
            out.flush()?;
            return Ok(());
        }
        Some(p) => p.to_path_buf(),
        None => {
            let name = opts.archpath.as_deref().unwrap_or(&key);
            let name = name.rsplit('/').next().filter(|n| !n.is_empty());
            PathBuf::from(name.context("the key has no file name; give a FILE")?)
        }
    };
    let f = File::create(&path).with_context(|| format!("creating {}", path.display()))?;
    let mut w = BufWriter::with_capacity(1 << 20, f);
    let result = client
        .get_with_into(&bucket, &key, &opts, &mut w)
        .map_err(anyhow::Error::from)
        .and_then(|meta| {
            w.flush()?;
            Ok(meta)
        });
    match result {
        Ok(meta) => {
            eprintln!("{} bytes -> {}", meta.size, path.display());
            Ok(())
        }
        Err(e) => {
            drop(w);
            let _ = std::fs::remove_file(&path);
            Err(e)
        }
    }
}

fn put(client: &mut Client, file: &Path, object: &str) -> Result<()> {
    let (bucket, mut key) = split_object(object, true)?;
    if key.is_empty() || key.ends_with('/') {
        let name = file
            .file_name()
            .context("the file has no name; give BUCKET/KEY")?;
        key.push_str(&name.to_string_lossy());
    }
    let f = File::open(file).with_context(|| format!("opening {}", file.display()))?;
    let len = f.metadata()?.len();
    let mut r = BufReader::with_capacity(1 << 20, f);
    let etag = client.put(&bucket, &key, &mut r, len)?;
    println!("{bucket}/{key}\t{len}\t{etag}");
    Ok(())
}

fn stat(client: &mut Client, object: &str, json: bool) -> Result<()> {
    let (bucket, key) = split_object(object, false)?;
    let m = client.stat(&bucket, &key)?;
    let modified = m.last_modified.map(format_time);
    if json {
        let v = serde_json::json!({
            "bucket": bucket, "key": key, "size": m.size, "etag": m.etag,
            "last_modified": modified, "content_type": m.content_type,
            "cache": m.cache, "node": m.node,
        });
        println!("{v:#}");
        return Ok(());
    }
    let dash = |v: Option<&str>| v.unwrap_or("-").to_owned();
    println!("key:           {bucket}/{key}");
    println!("size:          {}", m.size);
    println!("etag:          {}", dash(m.etag.as_deref()));
    println!("last-modified: {}", dash(modified.as_deref()));
    println!("content-type:  {}", dash(m.content_type.as_deref()));
    println!("cache:         {}", dash(m.cache.as_deref()));
    println!("node:          {}", dash(m.node.as_deref()));
    Ok(())
}

fn print_job(job: &Job) {
    println!(
        "{}\t{}\t{}\tobjects {}/{}\tbytes {}/{}\terrors {}",
        job.id,
        job.kind,
        job.state.as_str(),
        job.objects_done,
        job.objects_total,
        job.bytes_done,
        job.bytes_total,
        job.errors
    );
}

fn job(client: &mut Client, args: &JobArgs) -> Result<ExitCode> {
    match (&args.action, &args.id) {
        (Some(JobAction::Wait { id, interval_ms }), _) => follow(client, id, *interval_ms),
        (Some(JobAction::Cancel { id }), _) => {
            print_job(&client.cancel_job(id)?);
            Ok(ExitCode::SUCCESS)
        }
        (None, Some(id)) => {
            let j = client.job(id)?;
            if args.json {
                let v = serde_json::json!({
                    "id": j.id, "kind": j.kind, "state": j.state.as_str(),
                    "objects_done": j.objects_done, "objects_total": j.objects_total,
                    "bytes_done": j.bytes_done, "bytes_total": j.bytes_total, "errors": j.errors,
                });
                println!("{v:#}");
            } else {
                print_job(&j);
            }
            Ok(ExitCode::SUCCESS)
        }
        (None, None) => bail!("give a job id: `job ID`, `job wait ID` or `job cancel ID`"),
    }
}

/// Follows a job with a progress bar over its bytes; the exit status says how it ended.
fn follow(client: &mut Client, id: &str, interval_ms: u64) -> Result<ExitCode> {
    let bar = indicatif::ProgressBar::new(0);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {wide_bar} {bytes}/{total_bytes} ({bytes_per_sec}) {msg}",
        )
        .expect("a valid template"),
    );
    let job = client.wait_job(id, Duration::from_millis(interval_ms.max(10)), |j| {
        bar.set_length(j.bytes_total.max(j.bytes_done));
        bar.set_position(j.bytes_done);
        bar.set_message(format!(
            "{}/{} objects, {} errors",
            j.objects_done, j.objects_total, j.errors
        ));
    })?;
    bar.finish_and_clear();
    print_job(&job);
    Ok(match job.state {
        JobState::Done => ExitCode::SUCCESS,
        _ => {
            match &job.message {
                Some(m) if !m.is_empty() => eprintln!("job {id} ended {}: {m}", job.state.as_str()),
                _ => eprintln!("job {id} ended {}", job.state.as_str()),
            }
            ExitCode::FAILURE
        }
    })
}

/// Items from text: a JSON array, or one `BUCKET/KEY[#ARCHPATH]` a line (blank lines and
/// `#` comments skipped).
fn parse_items(text: &str) -> Result<Vec<BatchItem>> {
    if text.trim_start().starts_with('[') {
        return serde_json::from_str(text)
            .context("the items are not a JSON array of {bucket,key,archpath?}");
    }
    let mut items = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (object, archpath) = match line.split_once('#') {
            Some((o, a)) => (o, Some(a.to_owned())),
            None => (line, None),
        };
        let (bucket, key) =
            split_object(object, false).with_context(|| format!("line {}", n + 1))?;
        items.push(BatchItem {
            bucket,
            key,
            archpath,
        });
    }
    Ok(items)
}

fn batch(
    client: &mut Client,
    items: Option<&Path>,
    output: Option<&Path>,
    missing: MissingArg,
) -> Result<()> {
    let mut text = String::new();
    match items {
        Some(p) if p != Path::new("-") => {
            File::open(p)
                .with_context(|| format!("opening {}", p.display()))?
                .read_to_string(&mut text)?;
        }
        _ => {
            std::io::stdin().lock().read_to_string(&mut text)?;
        }
    }
    let items = parse_items(&text)?;
    if items.is_empty() {
        bail!("no items given");
    }
    let missing = match missing {
        MissingArg::Error => Missing::Error,
        MissingArg::Mark => Missing::Mark,
    };
    match output {
        Some(p) if p != Path::new("-") => {
            let f = File::create(p).with_context(|| format!("creating {}", p.display()))?;
            let mut w = BufWriter::with_capacity(1 << 20, f);
            let result = client
                .batch_into(&items, missing, &mut w)
                .map_err(anyhow::Error::from)
                .and_then(|n| {
                    w.flush()?;
                    Ok(n)
                });
            if let Err(e) = result {
                drop(w);
                let _ = std::fs::remove_file(p);
                return Err(e);
            }
        }
        _ => {
            let mut out = std::io::stdout().lock();
            client.batch_into(&items, missing, &mut out)?;
            out.flush()?;
        }
    }
    Ok(())
}

/// `granaryctl index BUCKET/PREFIX`: the catalog built from the shards, written back as
/// the dataset's index.
fn plans(client: &mut Client, json: bool, drop: Option<&str>) -> Result<()> {
    if let Some(id) = drop {
        client.drop_plan(id)?;
        println!("dropped {id}");
        return Ok(());
    }
    let plans = client.plans()?;
    if json {
        println!("{}", serde_json::to_string_pretty(&plans)?);
        return Ok(());
    }
    let bars = std::io::IsTerminal::is_terminal(&std::io::stdout());
    println!(
        "ID\tJOB\tDATASET\tEPOCH\tRANKS\tCONSUMED\tRATE/RANK\tFETCHED\tEVICTED\tREADY\tEXPIRES"
    );
    for p in plans {
        let total = p.per_rank * p.world_size as u64;
        let done = if total > 0 {
            p.consumed.min(total) as f64 / total as f64
        } else {
            0.0
        };
        let consumed = if bars {
            text_bar(done, true)
        } else {
            format!("{}/{}", p.consumed, total)
        };
        let reads = p.reads_ready + p.reads_waited;
        println!(
            "{}\t{}\t{}/{}\t{}\t{}\t{}\t{:.1}/s\t{}\t{}\t{}/{}\t{:.0}s",
            p.id,
            p.job.as_deref().unwrap_or("-"),
            p.bucket,
            p.prefix,
            p.epoch,
            p.world_size,
            consumed,
            p.rate,
            indicatif::HumanBytes(p.fetched_bytes),
            indicatif::HumanBytes(p.evicted_bytes),
            p.reads_ready,
            reads,
            p.expires_in_s
        );
    }
    Ok(())
}

fn index(client: &mut Client, target: &str) -> Result<()> {
    use granary_proto::shards::{Index, INDEX_NAME};
    let (bucket, prefix) = split_object(target, true)?;
    let catalog = client.catalog_with(&bucket, &prefix, true)?;
    if catalog.shards.is_empty() {
        anyhow::bail!("no .tar, .tar.gz or .tgz objects under {bucket}/{prefix}");
    }
    let body = serde_json::to_vec(&Index::of(&catalog))?;
    let key = format!("{prefix}{INDEX_NAME}");
    client.put(&bucket, &key, &mut body.as_slice(), body.len() as u64)?;
    let samples: u64 = catalog.shards.iter().map(|s| u64::from(s.samples)).sum();
    println!(
        "{bucket}/{key}: {} shards, {samples} samples",
        catalog.shards.len()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn objects_split() {
        assert_eq!(
            split_object("b/a/b.tar", false).unwrap(),
            ("b".into(), "a/b.tar".into())
        );
        assert_eq!(
            split_object("s3://b/k", false).unwrap(),
            ("b".into(), "k".into())
        );
        assert_eq!(split_object("b", true).unwrap(), ("b".into(), "".into()));
        assert!(split_object("b", false).is_err());
        assert!(split_object("/", true).is_err());
    }

    #[test]
    fn batch_items_parse_from_lines_and_json() {
        let items = parse_items("b/k1\n\n# note\nb/s.tar#dir/0.jpg\n").unwrap();
        assert_eq!(
            items,
            vec![
                BatchItem::object("b", "k1"),
                BatchItem::member("b", "s.tar", "dir/0.jpg")
            ]
        );
        let items = parse_items(
            r#" [{"bucket":"b","key":"k"},{"bucket":"c","key":"s.tar","archpath":"x"}]"#,
        )
        .unwrap();
        assert_eq!(
            items,
            vec![
                BatchItem::object("b", "k"),
                BatchItem::member("c", "s.tar", "x")
            ]
        );
        assert!(parse_items("nokey\n").is_err());
    }
}
