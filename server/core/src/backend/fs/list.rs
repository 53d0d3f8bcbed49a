//! Listing a bucket in key order: folders walked in the order their names sort as keys
//! (escaped keys merged in), a page built from a query's prefix, delimiter and start,
//! and each folder's sorted entries kept between the pages of one listing.

use std::fs::{self, File};
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::keypath::{self, ESCAPE_DIR};
use super::FsBackend;
use crate::backend::{ListPage, ListQuery, ObjectEntry, Result};

impl FsBackend {
    pub(super) async fn list_page(&self, bucket: &str, query: &ListQuery) -> Result<ListPage> {
        let (bucket, query) = (bucket.to_owned(), query.clone());
        self.blocking(move |inner| {
            let dir = inner.bucket_dir(&bucket)?;
            let (mut page, paths) = list_sync(&inner.listings, &dir, &query);
            for (obj, path) in page.objects.iter_mut().zip(paths) {
                // A file deleted since the walk keeps its entry with size 0, as a
                // listing racing a delete may show on S3 too.
                if let Ok(file) = File::open(&path) {
                    if let Ok(md) = file.metadata() {
                        let meta = inner.read_meta(&file, &md);
                        obj.etag = meta.etag;
                        obj.size = meta.size;
                        obj.last_modified = meta.last_modified;
                    }
                }
            }
            Ok(page)
        })
        .await
    }
}

/// The object key of `path`, a file under `bucket_dir`.
fn key_of(bucket_dir: &Path, path: &Path) -> Option<String> {
    let rel = path.strip_prefix(bucket_dir).ok()?;
    let comps: Option<Vec<&str>> = rel
        .components()
        .map(|c| match c {
            Component::Normal(s) => s.to_str(),
            _ => None,
        })
        .collect();
    let comps = comps?;
    if comps.first() == Some(&ESCAPE_DIR) {
        keypath::decode_escaped(comps[1..].iter().copied())
    } else {
        keypath::plain_key(comps.iter().copied())
    }
}

/// Every file under `dir`, reserved names included.
fn walk_all(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let Ok(ft) = entry.file_type() else { continue };
        if ft.is_dir() {
            walk_all(&entry.path(), out);
        } else {
            out.push(entry.path());
        }
    }
}

/// Folders' entries in key order, kept between the pages of a listing so that a page
/// costs its own keys and a binary search, not the whole folder: a 100,000-key folder is
/// read and sorted once, not once per page. An entry is used while the folder's mtime is
/// the same and no write through this backend happened since (`changed`); a folder
/// changed in the last second is not kept (mtimes are coarser than writes).
pub(super) struct Listings {
    pub(super) folders: moka::sync::Cache<PathBuf, (SystemTime, u64, Sorted)>,
    generation: std::sync::atomic::AtomicU64,
}

/// A folder's entries in key order: each name, with `/` after a folder's (so that `a/…`
/// sorts after `a-b`, as the keys do), and whether it is a folder.
type Sorted = Arc<Vec<(String, bool)>>;

/// Memory for kept folder listings.
const LISTINGS_CAPACITY: u64 = 64 << 20;

impl Listings {
    pub(super) fn new() -> Listings {
        Listings {
            folders: moka::sync::Cache::builder()
                .max_capacity(LISTINGS_CAPACITY)
                .weigher(|_, (_, _, v): &(SystemTime, u64, Sorted)| {
                    let bytes: usize = v.iter().map(|(n, _)| n.len() + 32).sum();
                    bytes.try_into().unwrap_or(u32::MAX)
                })
                .build(),
            generation: Default::default(),
        }
    }

    /// A key was written or removed through this backend (after the rename or unlink).
    pub(super) fn changed(&self) {
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    /// `dir`'s entries in key order (reserved names left out); `None` when it cannot
    /// be read.
    fn sorted(&self, dir: &Path) -> Option<Sorted> {
        let generation = self.generation.load(Ordering::Acquire);
        let mtime = fs::metadata(dir).and_then(|m| m.modified()).ok()?;
        if let Some((m, g, v)) = self.folders.get(dir) {
            if m == mtime && g == generation {
                return Some(v);
            }
        }
        let mut v = Vec::new();
        for entry in fs::read_dir(dir).ok()?.flatten() {
            let Ok(ft) = entry.file_type() else { continue };
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            if name.starts_with(keypath::RESERVED) {
                continue;
            }
            if ft.is_dir() {
                v.push((format!("{name}/"), true));
            } else if ft.is_file() || (ft.is_symlink() && entry.path().is_file()) {
                v.push((name.to_owned(), false));
            }
        }
        v.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        let v = Arc::new(v);
        let settled = SystemTime::now()
            .duration_since(mtime)
            .is_ok_and(|age| age > Duration::from_secs(1));
        if settled {
            self.folders
                .insert(dir.to_path_buf(), (mtime, generation, v.clone()));
        }
        Some(v)
    }
}

/// What the page wants next.
#[derive(PartialEq, Eq)]
enum Flow {
    More,
    Full,
}

/// One page being built from keys handed over in order.
struct PageBuilder<'q> {
    q: &'q ListQuery,
    delim: Option<&'q str>,
    /// Keys at or before this one are not wanted.
    after: Option<&'q str>,
    /// Keys under this common prefix are rolled up already.
    rolled: Option<String>,
    page: ListPage,
    paths: Vec<PathBuf>,
    count: usize,
}

impl<'q> PageBuilder<'q> {
    fn new(q: &'q ListQuery) -> PageBuilder<'q> {
        let delim = q.delimiter.as_deref().filter(|d| !d.is_empty());
        let after = q.after.as_deref();
        // Resuming after a rolled-up common prefix: every key under it is skipped.
        let rolled = after
            .filter(|a| a.len() > q.prefix.len() && delim.is_some_and(|d| a.ends_with(d)))
            .map(str::to_owned);
        PageBuilder {
            q,
            delim,
            after,
            rolled,
            page: ListPage::default(),
            paths: Vec::new(),
            count: 0,
        }
    }

    /// Whether no key starting with `s` is wanted (the whole folder can be passed by).
    fn passes(&self, s: &str) -> bool {
        self.rolled.as_deref().is_some_and(|cp| s.starts_with(cp))
            || self.after.is_some_and(|a| s < a && !a.starts_with(s))
    }

    fn push(&mut self, key: String, path: PathBuf) -> Flow {
        if !key.starts_with(&self.q.prefix)
            || self.after.is_some_and(|a| key.as_str() <= a)
            || self.rolled.as_deref().is_some_and(|cp| key.starts_with(cp))
        {
            return Flow::More;
        }
        if self.count == self.q.max_keys {
            self.page.is_truncated = true;
            return Flow::Full;
        }
        if let Some(d) = self.delim {
            if let Some(i) = key[self.q.prefix.len()..].find(d) {
                let cp = key[..self.q.prefix.len() + i + d.len()].to_owned();
                self.page.common_prefixes.push(cp.clone());
                self.page.last = Some(cp.clone());
                self.rolled = Some(cp);
                self.count += 1;
                return Flow::More;
            }
        }
        self.page.objects.push(ObjectEntry {
            key: key.clone(),
            size: 0,
            etag: String::new(),
            last_modified: UNIX_EPOCH,
        });
        self.paths.push(path);
        self.page.last = Some(key);
        self.count += 1;
        Flow::More
    }
}

/// The page, fed plain keys in order and merging the escaped ones in (few; a key at both
/// places briefly counts once, the plain copy, as in `locate`).
struct Merge<'q> {
    b: PageBuilder<'q>,
    escaped: std::iter::Peekable<std::vec::IntoIter<(String, PathBuf)>>,
}

impl Merge<'_> {
    fn visit(&mut self, key: String, path: PathBuf) -> Flow {
        while let Some((k, _)) = self.escaped.peek() {
            if *k > key {
                break;
            }
            let (k, p) = self.escaped.next().expect("peeked");
            if k != key && self.b.push(k, p) == Flow::Full {
                return Flow::Full;
            }
        }
        self.b.push(key, path)
    }
}

/// Hands the plain keys under `dir` (whose key prefix is `rel`) that the page may want to
/// `m`, in key order, until it is full. Entries wholly before the prefix or the page's
/// start are passed by with a binary search, folders rolled up into a common prefix
/// without being read.
fn walk_ordered(listings: &Listings, dir: &Path, rel: &str, m: &mut Merge<'_>) -> Flow {
    let Some(entries) = listings.sorted(dir) else {
        return Flow::More;
    };
    let q = m.b.q;
    let prefix = q.prefix.as_str();
    // Entries whose keys all come before `bound` (and do not lead to it).
    let before = |bound: &str| {
        entries.partition_point(|(n, is_dir)| {
            let s = format!("{rel}{n}");
            if *is_dir {
                s.as_str() < bound && !bound.starts_with(&s)
            } else {
                s.as_str() < bound
            }
        })
    };
    let mut start = before(prefix);
    if let Some(a) = m.b.after {
        start = start.max(before(a));
    }
    for (name, is_dir) in &entries[start..] {
        let s = format!("{rel}{name}");
        if !s.starts_with(prefix) && !prefix.starts_with(&s) {
            // Past the prefix: so is every later entry.
            break;
        }
        if *is_dir {
            if m.b.passes(&s) {
                continue;
            }
            let path = dir.join(&name[..name.len() - 1]);
            if walk_ordered(listings, &path, &s, m) == Flow::Full {
                return Flow::Full;
            }
        } else if m.visit(s, dir.join(name)) == Flow::Full {
            return Flow::Full;
        }
    }
    Flow::More
}

/// One page of keys, with the file of each object on it: the plain keys in key order from
/// the page's start, merged with the escaped ones.
pub(super) fn list_sync(
    listings: &Listings,
    bucket_dir: &Path,
    q: &ListQuery,
) -> (ListPage, Vec<PathBuf>) {
    let mut escaped = Vec::new();
    walk_all(&bucket_dir.join(ESCAPE_DIR), &mut escaped);
    let mut escaped: Vec<(String, PathBuf)> = escaped
        .into_iter()
        .filter_map(|p| key_of(bucket_dir, &p).map(|k| (k, p)))
        .filter(|(k, _)| k.starts_with(&q.prefix))
        .collect();
    escaped.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    let mut m = Merge {
        b: PageBuilder::new(q),
        escaped: escaped.into_iter().peekable(),
    };
    // Plain keys start at the deepest folder the prefix names.
    let (start, rel) = match q.prefix.rfind('/') {
        Some(i) => match keypath::plain_path(&q.prefix[..i]) {
            Some(p) => (bucket_dir.join(p), q.prefix[..=i].to_owned()),
            None => (bucket_dir.to_path_buf(), String::new()),
        },
        None => (bucket_dir.to_path_buf(), String::new()),
    };
    if walk_ordered(listings, &start, &rel, &mut m) == Flow::More {
        for (k, p) in m.escaped.by_ref() {
            if m.b.push(k, p) == Flow::Full {
                break;
            }
        }
    }
    (m.b.page, m.b.paths)
}
