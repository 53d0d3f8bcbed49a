//! Getting a rank's shards in epoch order: streamed one at a time over the reader's own
//! connection, or downloaded ahead by `read_ahead` background threads, each with its own
//! connection, so the next shards are in memory when the current one is used up.
//!
//! At most `read_ahead` shards are downloading or waiting at any time, besides the one
//! being read. Dropping the fetcher stops the downloads in flight at their next write.

use std::collections::VecDeque;
use std::io::{self, Cursor, Read, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender, SyncSender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use crate::{Client, Result};

/// A shard's bytes as they arrive (decompressed when the key says `.tar.gz`/`.tgz`).
pub(crate) type ShardStream = Box<dyn Read + Send>;

fn decompressed(key: &str, raw: ShardStream) -> ShardStream {
    if super::is_compressed(key) {
        Box::new(flate2::read::MultiGzDecoder::new(raw))
    } else {
        raw
    }
}

/// One download for a worker.
struct Task {
    key: String,
    reply: SyncSender<Result<Vec<u8>>>,
}

/// Fails writes once the fetcher is dropped, so a worker abandons its download.
struct Cancellable<'a> {
    out: &'a mut Vec<u8>,
    stop: &'a AtomicBool,
}

impl Write for Cancellable<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.stop.load(Ordering::Relaxed) {
            return Err(io::Error::other("the epoch was dropped"));
        }
        self.out.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Background downloads, in order, `depth` ahead of the reader.
pub(crate) struct ReadAhead {
    /// Shards not yet handed to a worker.
    queue: VecDeque<String>,
    /// Shards handed out, oldest first, with where their bytes will arrive.
    inflight: VecDeque<(String, Receiver<Result<Vec<u8>>>)>,
    tasks: Option<Sender<Task>>,
    stop: Arc<AtomicBool>,
    workers: Vec<JoinHandle<()>>,
}

impl ReadAhead {
    fn new(client: &Client, bucket: &str, shards: Vec<String>, depth: usize) -> ReadAhead {
        let (tx, rx) = mpsc::channel::<Task>();
        let rx = Arc::new(Mutex::new(rx));
        let stop = Arc::new(AtomicBool::new(false));
        let workers = (0..depth)
            .map(|_| {
                let rx = rx.clone();
                let stop = stop.clone();
                let mut client = client.fresh();
                let bucket = bucket.to_owned();
                std::thread::spawn(move || loop {
                    let task = match rx.lock() {
                        Ok(rx) => rx.recv(),
                        Err(_) => return,
                    };
                    let Ok(task) = task else { return };
                    if stop.load(Ordering::Relaxed) {
                        return;
                    }
                    let mut out = Vec::new();
                    let mut sink = Cancellable {
                        out: &mut out,
                        stop: &stop,
                    };
                    let result = client.get_into(&bucket, &task.key, &mut sink).map(|_| out);
                    let _ = task.reply.send(result);
                })
            })
            .collect();
        let mut ra = ReadAhead {
            queue: shards.into(),
            inflight: VecDeque::new(),
            tasks: Some(tx),
            stop,
            workers,
        };
        for _ in 0..depth {
            ra.submit();
        }
        ra
    }

    fn submit(&mut self) {
        let (Some(key), Some(tasks)) = (self.queue.pop_front(), &self.tasks) else {
            return;
        };
        let (reply, rx) = mpsc::sync_channel(1);
        let _ = tasks.send(Task {
            key: key.clone(),
            reply,
        });
        self.inflight.push_back((key, rx));
    }

    fn next(&mut self) -> Option<(String, Result<ShardStream>)> {
        let (key, rx) = self.inflight.pop_front()?;
        // The next download starts while this shard is read.
        self.submit();
        let result = rx.recv().unwrap_or_else(|_| {
            Err(crate::Error::Local(io::Error::other(
                "a read-ahead thread stopped before finishing its shard",
            )))
        });
        let stream = result.map(|bytes| decompressed(&key, Box::new(Cursor::new(bytes))));
        Some((key, stream))
    }
}

impl Drop for ReadAhead {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        self.tasks = None;
        // Workers end at their next write or task; nothing waits for them here.
        self.workers.clear();
    }
}

/// Hands out a rank's shards in order.
pub(crate) enum Fetcher {
    /// Each shard streamed as it is read.
    Direct {
        client: Client,
        bucket: String,
        queue: VecDeque<String>,
    },
    ReadAhead(ReadAhead),
}

impl Fetcher {
    pub(crate) fn new(
        client: Client,
        bucket: &str,
        shards: Vec<String>,
        read_ahead: usize,
    ) -> Fetcher {
        if read_ahead == 0 {
            Fetcher::Direct {
                client,
                bucket: bucket.to_owned(),
                queue: shards.into(),
            }
        } else {
            Fetcher::ReadAhead(ReadAhead::new(&client, bucket, shards, read_ahead))
        }
    }

    /// The next shard's key and its bytes, or why they could not be had.
    pub(crate) fn next(&mut self) -> Option<(String, Result<ShardStream>)> {
        match self {
            Fetcher::Direct {
                client,
                bucket,
                queue,
            } => {
                let key = queue.pop_front()?;
                let stream = client
                    .open(bucket, &key)
                    .map(|r| decompressed(&key, Box::new(r)));
                Some((key, stream))
            }
            Fetcher::ReadAhead(ra) => ra.next(),
        }
    }
}
