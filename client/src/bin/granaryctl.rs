//! `granaryctl`: the command-line client of a Granary node.

use clap::{Parser, Subcommand};
use granary_client::Client;

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
        default_value = "http://127.0.0.1:7070"
    )]
    endpoint: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Check that the node serves (exit status 0 when it does).
    Health,
    /// Print the node's counters as JSON.
    Stats,
    /// Download an object (`BUCKET/KEY`) to standard output.
    Cat {
        /// `bucket/key`
        object: String,
    },
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let mut client = Client::new(&cli.endpoint)?;
    match cli.command {
        Command::Health => println!("{}", client.health()?),
        Command::Stats => println!("{:#}", client.stats()?),
        Command::Cat { object } => {
            let path = format!("/{}", object.trim_start_matches('/'));
            let mut out = std::io::stdout().lock();
            let (resp, _) = client.get_into(&path, &mut out)?;
            if resp.status != 200 {
                anyhow::bail!("{} answered {}", path, resp.status);
            }
        }
    }
    Ok(())
}
