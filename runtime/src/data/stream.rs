//! Sparse training data read from disk shard by shard, never loaded whole:
//! `--train_files` / `--eval_files` (comma-separated paths or globs, plain
//! or gzipped), and the generated data when none are given.
//!
//! The files are indexed once when a task starts: one pass counts their
//! good examples (a malformed line is an error naming the file and the
//! line, or skipped with `--skip_bad_lines`) and keeps the byte offset of
//! every [`INDEX_STRIDE`]-th example. The shard dispatcher's shard `i` is
//! then the examples `i * shard_size ..` of the files in order, read by
//! seeking to the nearest kept offset; each epoch visits the shards in the
//! dispatcher's shuffled order and a shard's examples in an order shuffled
//! from the seed, the epoch and the shard. A gzipped file cannot be read
//! from the middle, nor can an object store's object (`s3://`, `gs://`,
//! `az://` URLs): the indexing pass writes its lines to a plain temporary
//! file (in the system's temporary directory, removed with the set) that
//! the shards are read from.

use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use flate2::read::MultiGzDecoder;
use rand::SeedableRng;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;

use super::batch::Batch;
use super::dataset::{DataError, TrainingSet};
use super::generate::Generator;
use super::shard::ShardBatches;
use super::sparse::{SparseExample, SparseFormat, sparse_batch};
use crate::dispatch::{ShardId, ShardPlan};
use crate::hash::derive_seed;
use crate::storage;

/// One offset kept per this many examples.
pub const INDEX_STRIDE: u64 = 256;

/// The paths of a comma-separated list of paths, object-store URLs
/// (`s3://bucket/day-1.txt.gz`) and globs (`*`, `?` in the file name, of a
/// directory or of a URL's prefix), each glob's matches sorted; a glob that
/// matches nothing is an error naming it.
pub fn expand_files(list: &str) -> Result<Vec<PathBuf>, DataError> {
    let mut out = Vec::new();
    for pattern in list.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let path = Path::new(pattern);
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if !name.contains(['*', '?']) {
            out.push(path.to_path_buf());
            continue;
        }
        let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
        let names = if storage::is_url(pattern) { remote_file_names(dir)? } else { local_file_names(dir)? };
        let mut matches: Vec<PathBuf> = names.into_iter().filter(|n| glob_match(name.as_bytes(), n.as_bytes())).map(|n| dir.join(n)).collect();
        if matches.is_empty() {
            return Err(DataError::NoMatch { pattern: pattern.to_string() });
        }
        matches.sort();
        out.extend(matches);
    }
    if out.is_empty() {
        return Err(DataError::NoMatch { pattern: list.to_string() });
    }
    Ok(out)
}

/// Names of the files directly in a local directory.
fn local_file_names(dir: &Path) -> Result<Vec<String>, DataError> {
    let entries = std::fs::read_dir(dir).map_err(|source| DataError::Io { path: dir.to_path_buf(), source })?;
    Ok(entries.filter_map(|e| e.ok()).filter(|e| e.path().is_file()).filter_map(|e| e.file_name().to_str().map(str::to_string)).collect())
}

/// Names of the objects directly under an object-store URL's prefix.
fn remote_file_names(dir: &Path) -> Result<Vec<String>, DataError> {
    let listing = storage::Location::parse(&dir.to_string_lossy()).and_then(|l| l.list())?;
    Ok(listing.files.into_iter().map(|(name, _)| name).collect())
}

/// `*` (any run) and `?` (any one byte) against a file name. Written here
/// rather than taken from a crate: a file name's two wildcards are all the
/// flags need.
fn glob_match(pattern: &[u8], name: &[u8]) -> bool {
    match (pattern.first(), name.first()) {
        (None, None) => true,
        (Some(b'*'), _) => glob_match(&pattern[1..], name) || (!name.is_empty() && glob_match(pattern, &name[1..])),
        (Some(b'?'), Some(_)) => glob_match(&pattern[1..], &name[1..]),
        (Some(p), Some(n)) if p == n => glob_match(&pattern[1..], &name[1..]),
        _ => false,
    }
}

/// A plain temporary copy of a gzipped file, removed when dropped.
#[derive(Debug)]
struct Spill(PathBuf);

impl Drop for Spill {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// One indexed file.
#[derive(Debug)]
struct IndexedFile {
    /// As given (for messages).
    source: PathBuf,
    /// What is read: the file itself, or its decompressed copy.
    readable: PathBuf,
    /// Good examples in it.
    examples: u64,
    /// Byte offset of the line of every INDEX_STRIDE-th good example.
    marks: Vec<u64>,
    _spill: Option<Spill>,
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> DataError + '_ {
    move |source| DataError::Io { path: path.to_path_buf(), source }
}

/// Files of sparse examples, indexed.
#[derive(Debug)]
pub struct FileSet {
    pub format: SparseFormat,
    pub skip_bad_lines: bool,
    files: Vec<IndexedFile>,
    /// Examples before each file.
    starts: Vec<u64>,
    /// Lines skipped as malformed while indexing.
    pub skipped: u64,
}

/// Reads a file's lines with their byte offsets, gunzipping it into `spill`
/// on the way when it is gzipped.
fn open_lines(path: &Path) -> Result<(Box<dyn BufRead>, bool), DataError> {
    if let Some(url) = path.to_str().filter(|p| storage::is_url(p)) {
        // An object is fetched whole once, while it is indexed, and read
        // from its local copy afterwards (object stores read ranges, not
        // lines).
        let bytes = storage::read(url)?;
        let gz = bytes.starts_with(&[0x1f, 0x8b]);
        let reader: Box<dyn Read> = if gz { Box::new(MultiGzDecoder::new(std::io::Cursor::new(bytes))) } else { Box::new(std::io::Cursor::new(bytes)) };
        return Ok((Box::new(BufReader::with_capacity(1 << 16, reader)), gz));
    }
    let mut f = File::open(path).map_err(io_err(path))?;
    let mut magic = [0u8; 2];
    let n = f.read(&mut magic).map_err(io_err(path))?;
    f.seek(SeekFrom::Start(0)).map_err(io_err(path))?;
    let gz = n == 2 && magic == [0x1f, 0x8b];
    let reader: Box<dyn Read> = if gz { Box::new(MultiGzDecoder::new(f)) } else { Box::new(f) };
    Ok((Box::new(BufReader::with_capacity(1 << 16, reader)), gz))
}

impl FileSet {
    /// Indexes `paths` in order.
    pub fn index(paths: &[PathBuf], format: SparseFormat, skip_bad_lines: bool) -> Result<Self, DataError> {
        static SPILLS: AtomicU64 = AtomicU64::new(0);
        let mut set = FileSet { format, skip_bad_lines, files: Vec::new(), starts: Vec::new(), skipped: 0 };
        let mut total = 0;
        for path in paths {
            let (mut lines, gz) = open_lines(path)?;
            let remote = path.to_str().is_some_and(storage::is_url);
            let spill = (gz || remote).then(|| {
                let n = SPILLS.fetch_add(1, Ordering::Relaxed);
                Spill(std::env::temp_dir().join(format!(
                    "tfjob-{}-{n}-{}.txt",
                    std::process::id(),
                    path.file_stem().and_then(|s| s.to_str()).unwrap_or("data")
                )))
            });
            let mut writer = match &spill {
                Some(s) => Some(BufWriter::new(File::create(&s.0).map_err(|source| DataError::Spill { path: s.0.clone(), source })?)),
                None => None,
            };
            let (mut offset, mut examples, mut line_no) = (0u64, 0u64, 0u64);
            let mut marks = Vec::new();
            let mut line = String::new();
            loop {
                line.clear();
                let n = lines.read_line(&mut line).map_err(|source| if gz { DataError::Gzip { path: path.clone(), source } } else { io_err(path)(source) })?;
                if n == 0 {
                    break;
                }
                line_no += 1;
                if let (Some(w), Some(s)) = (writer.as_mut(), spill.as_ref()) {
                    w.write_all(line.as_bytes()).map_err(|source| DataError::Spill { path: s.0.clone(), source })?;
                }
                if self_parse(format, &line, path, line_no, skip_bad_lines, &mut set.skipped)?.is_some() {
                    if examples % INDEX_STRIDE == 0 {
                        marks.push(offset);
                    }
                    examples += 1;
                }
                offset += n as u64;
            }
            if let (Some(mut w), Some(s)) = (writer, spill.as_ref()) {
                w.flush().map_err(|source| DataError::Spill { path: s.0.clone(), source })?;
            }
            let readable = spill.as_ref().map_or_else(|| path.clone(), |s| s.0.clone());
            set.starts.push(total);
            total += examples;
            set.files.push(IndexedFile { source: path.clone(), readable, examples, marks, _spill: spill });
        }
        if total == 0 {
            return Err(DataError::NoExamples { path: paths.first().cloned().unwrap_or_default() });
        }
        if set.skipped > 0 {
            tracing::warn!("skipped {} malformed line(s) (--skip_bad_lines)", set.skipped);
        }
        Ok(set)
    }

    /// Good examples in all the files.
    pub fn len(&self) -> u64 {
        self.starts.last().zip(self.files.last()).map_or(0, |(s, f)| s + f.examples)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The examples `range` (of the files in order), read from disk.
    pub fn read(&self, range: Range<u64>) -> Result<Vec<SparseExample>, DataError> {
        let mut out = Vec::with_capacity((range.end - range.start) as usize);
        let mut next = range.start;
        for (f, &start) in self.files.iter().zip(&self.starts) {
            if next >= range.end {
                break;
            }
            if next >= start + f.examples {
                continue;
            }
            let local = next - start;
            let take = (range.end - next).min(f.examples - local);
            let mark = (local / INDEX_STRIDE) as usize;
            let mut reader = BufReader::with_capacity(1 << 16, File::open(&f.readable).map_err(io_err(&f.source))?);
            reader.seek(SeekFrom::Start(f.marks[mark])).map_err(io_err(&f.source))?;
            let mut skip = local - mark as u64 * INDEX_STRIDE;
            let mut got = 0;
            let mut line = String::new();
            let mut ignored = 0;
            while got < take {
                line.clear();
                if reader.read_line(&mut line).map_err(io_err(&f.source))? == 0 {
                    return Err(DataError::Truncated { path: f.source.clone(), part: "examples", expected: f.examples, found: local + got });
                }
                // Lines were checked when indexed: a bad one now is skipped as then.
                let Some(e) = self_parse(self.format, &line, &f.source, 0, true, &mut ignored)? else { continue };
                if skip > 0 {
                    skip -= 1;
                    continue;
                }
                out.push(e);
                got += 1;
            }
            next += take;
        }
        Ok(out)
    }
}

/// Parses one line; a malformed one is an error naming the file and the
/// line, or (with `skip`) counted and left out.
fn self_parse(format: SparseFormat, line: &str, path: &Path, line_no: u64, skip: bool, skipped: &mut u64) -> Result<Option<SparseExample>, DataError> {
    match format.parse(line) {
        Ok(e) => Ok(e),
        Err(_) if skip => {
            *skipped += 1;
            Ok(None)
        }
        Err(reason) => Err(DataError::BadLine { path: path.to_path_buf(), line: line_no, reason }),
    }
}

/// The first `n` good examples of `paths` (held-out data), read until
/// there are enough.
pub fn read_head(paths: &[PathBuf], format: SparseFormat, n: usize, skip_bad_lines: bool) -> Result<Vec<SparseExample>, DataError> {
    let mut out = Vec::new();
    let mut skipped = 0;
    for path in paths {
        let (mut lines, _) = open_lines(path)?;
        let mut line = String::new();
        let mut line_no = 0;
        while out.len() < n {
            line.clear();
            if lines.read_line(&mut line).map_err(io_err(path))? == 0 {
                break;
            }
            line_no += 1;
            out.extend(self_parse(format, &line, path, line_no, skip_bad_lines, &mut skipped)?);
        }
    }
    Ok(out)
}

/// Shard `shard`'s examples: the run of `plan.shard_size` examples at its
/// index, in an order shuffled from the seed, the epoch and the shard.
fn shard_order(plan: &ShardPlan, shard: ShardId) -> (Range<u64>, Vec<usize>) {
    let range = plan.shard_positions(shard.index);
    let mut order: Vec<usize> = (0..(range.end - range.start) as usize).collect();
    order.shuffle(&mut StdRng::seed_from_u64(derive_seed(plan.seed, shard.epoch, shard.index)));
    (range, order)
}

/// Bytes of parsed shards a training set keeps ([`ShardCache`]).
pub const SHARD_CACHE_BYTES: usize = 64 << 20;

/// A training set of files, read shard by shard.
pub struct StreamedTrainingSet {
    pub files: FileSet,
    cache: ShardCache,
}

impl StreamedTrainingSet {
    pub fn new(files: FileSet) -> Self {
        StreamedTrainingSet { files, cache: ShardCache::new(SHARD_CACHE_BYTES) }
    }
}

impl TrainingSet for StreamedTrainingSet {
    fn num_examples(&self) -> usize {
        self.files.len() as usize
    }

    /// # Panics
    /// When a file changed or vanished since it was indexed (the task
    /// cannot go on with its data gone; the message names the file).
    fn shard_batches(&self, plan: &ShardPlan, shard: ShardId, batch_size: usize) -> ShardBatches {
        self.cache.shard_batches(plan, shard, batch_size, |range| {
            let examples = self.files.read(range).unwrap_or_else(|e| panic!("reading the training data: {e}"));
            sparse_batch(&examples, self.files.format)
        })
    }
}

/// Shards parsed (or generated) once, kept as one batch each in file order (up to a byte budget;
/// shards past it are made again each time): an epoch after the first reads no text. Parsing was
/// a third of a sparse worker's time, epoch after epoch, for the same bytes. A shard's batches
/// are then copies of its rows in the epoch's order.
struct ShardCache {
    budget: usize,
    kept: std::sync::Mutex<(usize, KeptShards)>,
}

/// Parsed shards by their range of examples.
type KeptShards = std::collections::HashMap<(u64, u64), std::sync::Arc<Batch>>;

impl ShardCache {
    fn new(budget: usize) -> Self {
        ShardCache { budget, kept: Default::default() }
    }

    /// The batches of `shard` in its epoch's order, its examples made by `make` (one batch of
    /// the shard's range, in order) unless kept.
    fn shard_batches(&self, plan: &ShardPlan, shard: ShardId, batch_size: usize, make: impl FnOnce(Range<u64>) -> Batch) -> ShardBatches {
        let (range, order) = shard_order(plan, shard);
        let made = self.get_or_read(range.clone(), || make(range));
        ShardBatches::picked(made, order, batch_size.max(1))
    }

    fn get_or_read(&self, range: Range<u64>, read: impl FnOnce() -> Batch) -> std::sync::Arc<Batch> {
        let key = (range.start, range.end);
        if let Some(b) = self.kept.lock().expect("shard cache").1.get(&key) {
            return b.clone();
        }
        let parsed = std::sync::Arc::new(read());
        let size = batch_bytes(&parsed);
        let mut kept = self.kept.lock().expect("shard cache");
        if let Some(first) = kept.1.get(&key) {
            // Another thread parsed the same shard meanwhile: keep one copy, counted once.
            return first.clone();
        }
        if kept.0 + size <= self.budget {
            kept.0 += size;
            kept.1.insert(key, parsed.clone());
        }
        parsed
    }
}

/// The heap bytes of a sparse batch's arrays.
fn batch_bytes(b: &Batch) -> usize {
    let features = b.sparse.as_ref().map_or(0, |f| f.offsets.len() * 8 + f.keys.len() * (8 + 4 + 4));
    b.x.len() * 4 + b.len() * 4 + features
}

/// The generator's training examples `0..examples`, made on demand, each shard kept once made
/// (as parsed files are: [`ShardCache`], so within its budget an epoch after the first makes
/// nothing: making an example was most of a single-process sparse step).
pub struct GeneratedTrainingSet {
    pub generator: Generator,
    pub examples: u64,
    cache: ShardCache,
}

impl GeneratedTrainingSet {
    pub fn new(generator: Generator, examples: u64) -> Self {
        GeneratedTrainingSet { generator, examples, cache: ShardCache::new(SHARD_CACHE_BYTES) }
    }
}

impl TrainingSet for GeneratedTrainingSet {
    fn num_examples(&self) -> usize {
        self.examples as usize
    }

    fn shard_batches(&self, plan: &ShardPlan, shard: ShardId, batch_size: usize) -> ShardBatches {
        self.cache.shard_batches(plan, shard, batch_size, |range| {
            let examples: Vec<SparseExample> = range.map(|i| self.generator.example(i).0).collect();
            sparse_batch(&examples, self.generator.format)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::Targets;

    /// The batches of `shard` made without any cache: the generator's examples of the shard
    /// put in the epoch's order, then batched.
    fn batched_directly(g: &Generator, plan: &ShardPlan, shard: ShardId, batch_size: usize) -> Vec<Batch> {
        let (range, order) = shard_order(plan, shard);
        let examples: Vec<SparseExample> = range.map(|i| g.example(i).0).collect();
        let shuffled: Vec<SparseExample> = order.iter().map(|&k| examples[k].clone()).collect();
        shuffled.chunks(batch_size).map(|c| sparse_batch(c, g.format)).collect()
    }

    fn write(dir: &Path, name: &str, text: &str, gz: bool) -> PathBuf {
        let path = dir.join(name);
        if gz {
            let mut e = flate2::write::GzEncoder::new(File::create(&path).unwrap(), flate2::Compression::default());
            e.write_all(text.as_bytes()).unwrap();
            e.finish().unwrap();
        } else {
            std::fs::write(&path, text).unwrap();
        }
        path
    }

    /// Plain and gzipped files, one shard crossing from one to the other:
    /// every example once per epoch, in the files' examples; bad lines
    /// named or skipped.
    #[test]
    fn files_are_indexed_once_and_read_by_shard() {
        let dir = tempfile::tempdir().unwrap();
        let g = Generator::new(SparseFormat::Libsvm, 3);
        let lines = |r: Range<u64>| r.map(|i| g.line(i)).collect::<String>();
        // 700 examples: 600 plain (with a blank line), 100 gzipped.
        let a = write(dir.path(), "part-0.txt", &(lines(0..300) + "\n" + &lines(300..600)), false);
        let b = write(dir.path(), "part-1.txt.gz", &lines(600..700), true);
        let files = expand_files(&format!("{}/part-*", dir.path().display())).unwrap();
        assert_eq!(files, vec![a.clone(), b.clone()]);
        let set = FileSet::index(&files, SparseFormat::Libsvm, false).unwrap();
        assert_eq!(set.len(), 700);
        assert_eq!(set.read(590..610).unwrap(), (590..610).map(|i| g.example(i).0).collect::<Vec<_>>(), "across the two files");
        assert_eq!(set.read(257..259).unwrap(), (257..259).map(|i| g.example(i).0).collect::<Vec<_>>(), "past an index mark");
        let training = StreamedTrainingSet::new(set);
        let plan = ShardPlan::new(700, 64, 9, Some(1)).unwrap();
        let mut seen: Vec<(u32, usize)> = Vec::new();
        for index in 0..plan.shards_per_epoch() {
            for batch in training.shard_batches(&plan, ShardId { epoch: 0, index }, 10) {
                let Targets::Labels(l) = &batch.targets else { panic!() };
                let f = batch.sparse.as_ref().unwrap();
                seen.extend(l.iter().enumerate().map(|(i, &y)| (y, f.offsets[i + 1] - f.offsets[i])));
            }
        }
        let mut want: Vec<(u32, usize)> = (0..700).map(|i| g.example(i).0).map(|e| (e.label, e.features.len())).collect();
        seen.sort();
        want.sort();
        assert_eq!(seen, want, "every example once per epoch");
        // A bad line: named, or skipped.
        let bad = write(dir.path(), "bad.txt", &(lines(0..3) + "1 3:x\n" + &lines(3..5)), false);
        let err = FileSet::index(std::slice::from_ref(&bad), SparseFormat::Libsvm, false).unwrap_err().to_string();
        assert!(err.contains("bad.txt: line 4: feature \"3:x\": value \"x\" is not a finite number"), "{err}");
        let set = FileSet::index(&[bad], SparseFormat::Libsvm, true).unwrap();
        assert_eq!((set.len(), set.skipped), (5, 1));
        assert_eq!(set.read(3..5).unwrap(), vec![g.example(3).0, g.example(4).0]);
        // Globs that match nothing, files that do not exist, corrupt gzip.
        assert!(expand_files(&format!("{}/nope-*", dir.path().display())).unwrap_err().to_string().contains("no file matches"));
        assert!(FileSet::index(&[dir.path().join("absent")], SparseFormat::Libsvm, false).unwrap_err().to_string().contains("absent: cannot read"));
        let corrupt = dir.path().join("c.gz");
        std::fs::write(&corrupt, [0x1f, 0x8b, 8, 0, 1, 2, 3]).unwrap();
        assert!(FileSet::index(&[corrupt], SparseFormat::Libsvm, false).unwrap_err().to_string().contains("c.gz: corrupt gzip data"));
        // Held-out: the first examples, read until there are enough.
        assert_eq!(read_head(&[a, b], SparseFormat::Libsvm, 3, false).unwrap(), (0..3).map(|i| g.example(i).0).collect::<Vec<_>>());
    }

    #[test]
    fn cached_shards_give_the_batches_that_parsing_again_gives() {
        let dir = tempfile::tempdir().unwrap();
        for format in [SparseFormat::Libsvm, SparseFormat::Criteo] {
            let g = Generator::new(format, 5);
            let path = write(dir.path(), &format!("{format}.txt"), &(0..300).map(|i| g.line(i)).collect::<String>(), false);
            let files = FileSet::index(&[path], format, false).unwrap();
            let cached = StreamedTrainingSet::new(files);
            let generated = GeneratedTrainingSet::new(Generator::new(format, 5), 300);
            let plan = ShardPlan::new(300, 64, 11, Some(1)).unwrap();
            for epoch in 0..3 {
                for index in 0..plan.shards_per_epoch() {
                    let shard = ShardId { epoch, index };
                    // The same examples made by the generator, batched without any cache.
                    let want = batched_directly(&g, &plan, shard, 10);
                    assert_eq!(cached.shard_batches(&plan, shard, 10).collect::<Vec<_>>(), want, "{format} epoch {epoch} shard {index}");
                    assert_eq!(generated.shard_batches(&plan, shard, 10).collect::<Vec<_>>(), want, "{format} generated, epoch {epoch} shard {index}");
                }
            }
            for (set, kept) in [("files", &cached.cache), ("generated", &generated.cache)] {
                let kept = kept.kept.lock().unwrap();
                assert_eq!(kept.1.len(), plan.shards_per_epoch() as usize, "{format} {set}: every shard made once and kept");
            }
        }
        // Past its budget the cache keeps nothing and the batches are the same.
        let g = Generator::new(SparseFormat::Libsvm, 5);
        let path = write(dir.path(), "small.txt", &(0..100).map(|i| g.line(i)).collect::<String>(), false);
        let uncached = StreamedTrainingSet { files: FileSet::index(&[path], SparseFormat::Libsvm, false).unwrap(), cache: ShardCache::new(0) };
        let plan = ShardPlan::new(100, 30, 11, Some(1)).unwrap();
        let shard = ShardId { epoch: 1, index: 2 };
        assert_eq!(uncached.shard_batches(&plan, shard, 7).collect::<Vec<_>>(), batched_directly(&g, &plan, shard, 7));
        assert!(uncached.cache.kept.lock().unwrap().1.is_empty());
    }

    #[test]
    fn globs() {
        for (p, n, want) in [("*.txt", "a.txt", true), ("*.txt", "a.txt.gz", false), ("part-?", "part-1", true), ("p*t*", "part", true), ("x", "y", false)] {
            assert_eq!(glob_match(p.as_bytes(), n.as_bytes()), want, "{p} {n}");
        }
    }
}
