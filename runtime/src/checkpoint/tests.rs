use super::*;
use std::fs;
use std::path::{Path, PathBuf};

// The tests damage files on disk: they name checkpoints by local paths. These
// wrap the functions under test (taking a storage location) for paths.
fn at(path: &Path) -> Location {
    Location::local(path).unwrap()
}

fn local(location: &Location) -> PathBuf {
    location.local_path().expect("a local location").to_path_buf()
}

fn checkpoint_path(dir: &Path, step: i64) -> PathBuf {
    local(&super::checkpoint_path(&at(dir), step))
}

fn write_shard(dir: &Path, step: i64, ps: usize, num_ps: usize, data: &ShardData) -> Result<ShardInfo, CheckpointError> {
    super::write_shard(&at(dir), step, ps, num_ps, data)
}

fn write_index(dir: &Path, step: i64, num_ps: usize, shards: &[ShardInfo]) -> Result<PathBuf, CheckpointError> {
    super::write_index(&at(dir), step, num_ps, shards).map(|l| local(&l))
}

fn list(dir: &Path) -> Result<Vec<CheckpointListing>, CheckpointError> {
    super::list(&at(dir))
}

fn latest_complete(dir: &Path) -> Result<Option<Checkpoint>, CheckpointError> {
    super::latest_complete(&at(dir))
}

fn prune(dir: &Path, keep_last: usize) -> Result<Vec<PathBuf>, CheckpointError> {
    super::prune(&at(dir), keep_last).map(|deleted| deleted.iter().map(local).collect())
}

fn inspect(dir: &Path) -> Result<String, CheckpointError> {
    super::inspect(&at(dir))
}

fn verify(ckpt: &Path, step: i64) -> CheckpointStatus {
    super::verify(&at(ckpt), step)
}

/// What ps `ps` of 2 holds at `step`: a matrix and a bias with Adam slots, and a scalar.
fn shard(ps: usize, step: i64) -> ShardData {
    let x = step as f32 + ps as f32 / 10.0;
    let w = format!("layer{ps}/w");
    let b = format!("layer{ps}/b");
    ShardData {
        variables: vec![
            (w.clone(), vec![2, 3], (0..6).map(|i| x + i as f32).collect()),
            (b.clone(), vec![3], vec![-x, 0.0, f32::MIN_POSITIVE]),
            (format!("scale{ps}"), vec![], vec![x * 2.0]),
        ],
        slots: vec![
            (format!("{w}:slot0"), vec![2, 3], vec![0.5; 6]),
            (format!("{w}:slot1"), vec![2, 3], vec![0.25; 6]),
            (format!("{b}:slot0"), vec![3], vec![1.0, 2.0, 3.0]),
        ],
        updates: vec![(w, step as u64 * 3 + 1), (b, u64::MAX)],
        dispatcher: (ps == 0).then(|| {
            format!(r#"{{"plan":{{"examples":100,"shard_size":10,"seed":1,"num_epochs":3}},"next":[1,{}],"not_done":[],"shards_redone":2}}"#, step % 10)
        }),
        ..Default::default()
    }
}

/// Writes a complete checkpoint of `num_ps` shards at `step`.
fn save(dir: &Path, step: i64, num_ps: usize) -> Vec<ShardInfo> {
    let infos: Vec<ShardInfo> = (0..num_ps).map(|ps| write_shard(dir, step, ps, num_ps, &shard(ps, step)).unwrap()).collect();
    write_index(dir, step, num_ps, &infos).unwrap();
    infos
}

fn shard_path(dir: &Path, step: i64, ps: usize, num_ps: usize) -> PathBuf {
    checkpoint_path(dir, step).join(shard_file_name(ps, num_ps))
}

fn status_of(dir: &Path, step: i64) -> CheckpointStatus {
    verify(&checkpoint_path(dir, step), step)
}

fn steps(dir: &Path) -> Vec<i64> {
    list(dir).unwrap().iter().map(|l| l.step).collect()
}

#[test]
fn round_trip() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("ckpts");
    let infos = save(&dir, 1200, 2);

    assert_eq!(infos[1].file, "shard-00001-of-00002.safetensors");
    let bytes = fs::read(shard_path(&dir, 1200, 1, 2)).unwrap();
    assert_eq!(infos[1].bytes, bytes.len() as u64);
    assert_eq!(infos[1].crc32c, crc32c::crc32c(&bytes));
    assert_eq!(infos[1].variables[0], TensorEntry { name: "layer1/w".into(), shape: vec![2, 3] });
    assert_eq!(infos[1].updates, vec!["layer1/w".to_string(), "layer1/b".to_string()]);

    let ckpt = latest_complete(&dir).unwrap().expect("a complete checkpoint");
    assert_eq!(local(&ckpt.path), dir.join("ckpt-0000001200"));
    assert_eq!(ckpt.global_step, 1200);
    assert_eq!(ckpt.num_ps, 2);
    assert_eq!(ckpt.shards, infos);
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs();
    assert!(ckpt.created_unix_secs <= now && now - ckpt.created_unix_secs < 600);
    for ps in 0..2 {
        assert_eq!(read_shard(&ckpt, ps).unwrap(), shard(ps, 1200), "ps {ps}");
    }
    let all = read_all(&ckpt).unwrap();
    assert_eq!(all.variables.len(), 6);
    assert_eq!(all.variables[3], shard(1, 1200).variables[0]);
    assert!(matches!(read_shard(&ckpt, 2), Err(CheckpointError::InvalidArgument { .. })));

    // The directory holds exactly the shards and the index: no temporary files left.
    let mut names: Vec<String> = fs::read_dir(local(&ckpt.path)).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    names.sort();
    assert_eq!(names, ["index.json", "shard-00000-of-00002.safetensors", "shard-00001-of-00002.safetensors"]);
}

#[test]
fn index_json_is_documented_shape() {
    let tmp = tempfile::tempdir().unwrap();
    let infos = save(tmp.path(), 7, 2);
    let text = fs::read_to_string(checkpoint_path(tmp.path(), 7).join("index.json")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["format"], "tfjob-checkpoint/1");
    assert_eq!(v["global_step"], 7);
    assert_eq!(v["num_ps"], 2);
    assert_eq!(v["checksum"], "crc32c");
    assert!(v["created"].as_str().unwrap().ends_with('Z'));
    let s0 = &v["shards"][0];
    assert_eq!(s0["file"], "shard-00000-of-00002.safetensors");
    assert_eq!(s0["bytes"], infos[0].bytes);
    assert_eq!(s0["crc32c"], format!("{:08x}", infos[0].crc32c));
    assert_eq!(s0["variables"][0]["name"], "layer0/w");
    assert_eq!(s0["variables"][0]["shape"], serde_json::json!([2, 3]));
    assert_eq!(s0["variables"][2]["shape"], serde_json::json!([]));
    assert_eq!(s0["slots"][1]["name"], "layer0/w:slot1");
}

/// Checked against the safetensors format itself (u64 LE header size, JSON
/// header with `__metadata__`), not only through our own reader.
#[test]
fn shards_are_plain_safetensors() {
    let tmp = tempfile::tempdir().unwrap();
    save(tmp.path(), 5, 2);
    let bytes = fs::read(shard_path(tmp.path(), 5, 1, 2)).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let meta = &header["__metadata__"];
    assert_eq!(meta["format"], "tfjob-checkpoint-shard/1");
    assert_eq!(meta["global_step"], "5");
    assert_eq!(meta["ps_index"], "1");
    assert_eq!(meta["num_ps"], "2");
    assert_eq!(meta["slots"], r#"["layer1/w:slot0","layer1/w:slot1","layer1/b:slot0"]"#);
    assert_eq!(meta["updates"], r#"["layer1/w","layer1/b"]"#);
    assert_eq!(header["layer1/w"]["dtype"], "F32");
    assert_eq!(header["layer1/w"]["shape"], serde_json::json!([2, 3]));
    assert_eq!(header["layer1/b:updates"]["dtype"], "U64");
    assert_eq!(header["layer1/b:updates"]["shape"], serde_json::json!([1]));
    let [start, end] = [0, 1].map(|i| header["layer1/w"]["data_offsets"][i].as_u64().unwrap() as usize);
    let data = &bytes[8 + n + start..8 + n + end];
    assert_eq!(&data[..4], &5.1f32.to_le_bytes());
    let st = SafeTensors::deserialize(&bytes).unwrap();
    assert_eq!(st.len(), 3 + 3 + 2);
}

#[test]
fn truncated_shard_is_damaged_and_skipped_for_the_previous_checkpoint() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    save(dir, 100, 2);
    save(dir, 200, 2);
    let path = shard_path(dir, 200, 1, 2);
    let bytes = fs::read(&path).unwrap();
    fs::write(&path, &bytes[..bytes.len() - 10]).unwrap();

    match status_of(dir, 200) {
        CheckpointStatus::Damaged(reason) => {
            assert!(reason.contains("shard-00001-of-00002.safetensors") && reason.contains("truncated"), "{reason}")
        }
        other => panic!("{other:?}"),
    }
    let ckpt = latest_complete(dir).unwrap().unwrap();
    assert_eq!(ckpt.global_step, 100);
    assert_eq!(read_shard(&ckpt, 1).unwrap(), shard(1, 100));
}

#[test]
fn a_flipped_byte_in_tensor_data_is_caught_by_the_checksum() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    save(dir, 100, 2);
    let infos = save(dir, 200, 2);
    let path = shard_path(dir, 200, 0, 2);
    let mut bytes = fs::read(&path).unwrap();
    let last = bytes.len() - 3;
    bytes[last] ^= 0x10;
    // Still a well-formed safetensors file of the right size: only the checksum can tell.
    assert!(SafeTensors::deserialize(&bytes).is_ok());
    fs::write(&path, &bytes).unwrap();

    match status_of(dir, 200) {
        CheckpointStatus::Damaged(reason) => assert!(reason.contains("checksum mismatch"), "{reason}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(latest_complete(dir).unwrap().unwrap().global_step, 100);
    // Reading the damaged checkpoint directly also refuses, naming the file.
    let ckpt = Checkpoint { path: at(&checkpoint_path(dir, 200)), global_step: 200, num_ps: 2, created_unix_secs: 0, shards: infos, layout: None };
    let err = read_shard(&ckpt, 0).unwrap_err();
    assert!(matches!(err, CheckpointError::Damaged { .. }), "{err}");
    assert!(err.to_string().contains(path.to_str().unwrap()), "{err}");
    assert!(read_shard(&ckpt, 1).is_ok());
}

#[test]
fn a_crash_before_the_index_is_incomplete_and_skipped() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    save(dir, 100, 2);
    write_shard(dir, 200, 0, 2, &shard(0, 200)).unwrap();
    write_shard(dir, 200, 1, 2, &shard(1, 200)).unwrap();
    match status_of(dir, 200) {
        CheckpointStatus::Incomplete(reason) => {
            assert!(reason.contains("no index.json") && reason.contains("2 shard file(s)"), "{reason}")
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(latest_complete(dir).unwrap().unwrap().global_step, 100);
}

#[test]
fn a_missing_shard_is_damaged_and_skipped() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    save(dir, 100, 2);
    save(dir, 200, 2);
    fs::remove_file(shard_path(dir, 200, 0, 2)).unwrap();
    match status_of(dir, 200) {
        CheckpointStatus::Damaged(reason) => assert!(reason.contains("missing"), "{reason}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(latest_complete(dir).unwrap().unwrap().global_step, 100);
}

#[test]
fn nothing_complete_means_none() {
    let tmp = tempfile::tempdir().unwrap();
    assert_eq!(latest_complete(&tmp.path().join("absent")).unwrap(), None);
    assert_eq!(list(&tmp.path().join("absent")).unwrap(), vec![]);
    write_shard(tmp.path(), 100, 0, 2, &shard(0, 100)).unwrap();
    assert_eq!(latest_complete(tmp.path()).unwrap(), None);
}

#[test]
fn temp_files_never_count() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    save(dir, 100, 2);
    // ckpt 200: a shard and the index were only ever written to temporary names
    // (a crash before their rename).
    let infos: Vec<ShardInfo> = (0..2).map(|ps| write_shard(dir, 200, ps, 2, &shard(ps, 200)).unwrap()).collect();
    write_index(dir, 200, 2, &infos).unwrap();
    let ckpt = checkpoint_path(dir, 200);
    let index = ckpt.join("index.json");
    fs::rename(&index, ckpt.join(".index.json.tmp-1-0")).unwrap();
    assert!(matches!(status_of(dir, 200), CheckpointStatus::Incomplete(_)));
    fs::rename(ckpt.join(".index.json.tmp-1-0"), &index).unwrap();
    let shard1 = shard_path(dir, 200, 1, 2);
    fs::rename(&shard1, ckpt.join(".shard-00001-of-00002.safetensors.tmp-1-1")).unwrap();
    assert!(matches!(status_of(dir, 200), CheckpointStatus::Damaged(r) if r.contains("missing")));
    // Without the index, only the real shard is counted.
    fs::remove_file(&index).unwrap();
    assert!(matches!(status_of(dir, 200), CheckpointStatus::Incomplete(r) if r.contains("1 shard file(s)")));
    assert_eq!(latest_complete(dir).unwrap().unwrap().global_step, 100);
    // A temporary directory name is not a checkpoint either.
    fs::create_dir(dir.join(".ckpt-0000000300.tmp-1-2")).unwrap();
    assert_eq!(steps(dir), [100, 200]);
}

#[test]
fn only_canonical_checkpoint_directories_are_listed() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    save(dir, 3, 1);
    for other in ["ckpt-3", "ckpt-abc", "ckpt-", "ckpt-00000000004x", "checkpoint"] {
        fs::create_dir(dir.join(other)).unwrap();
    }
    fs::write(dir.join("ckpt-0000000009"), b"a file").unwrap();
    assert_eq!(steps(dir), [3]);
    assert_eq!(checkpoint_path(dir, 12_345_678_901), dir.join("ckpt-12345678901"));
    assert_eq!(parse_dir_name("ckpt-12345678901"), Some(12_345_678_901));
}

#[test]
fn garbage_or_inconsistent_index_is_damaged() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    save(dir, 100, 2);
    let index = checkpoint_path(dir, 100).join("index.json");
    let good = fs::read_to_string(&index).unwrap();

    fs::write(&index, "{ not json").unwrap();
    assert!(matches!(status_of(dir, 100), CheckpointStatus::Damaged(r) if r.contains("does not parse")));
    fs::write(&index, &good[..good.len() / 2]).unwrap();
    assert!(matches!(status_of(dir, 100), CheckpointStatus::Damaged(r) if r.contains("index.json")));
    fs::write(&index, good.replace("\"global_step\": 100", "\"global_step\": 99")).unwrap();
    assert!(matches!(status_of(dir, 100), CheckpointStatus::Damaged(r) if r.contains("directory is for step 100")));
    let v: serde_json::Value = serde_json::from_str(&good).unwrap();
    let mut one_shard = v.clone();
    one_shard["shards"].as_array_mut().unwrap().pop();
    fs::write(&index, one_shard.to_string()).unwrap();
    assert!(matches!(status_of(dir, 100), CheckpointStatus::Damaged(r) if r.contains("lists 1 shards for num_ps 2")));
    let mut bad_crc = v.clone();
    bad_crc["shards"][0]["crc32c"] = "xyz".into();
    fs::write(&index, bad_crc.to_string()).unwrap();
    assert!(matches!(status_of(dir, 100), CheckpointStatus::Damaged(r) if r.contains("8 hex digits")));
    let mut escape = v.clone();
    escape["shards"][0]["file"] = "../../etc/passwd".into();
    fs::write(&index, escape.to_string()).unwrap();
    assert!(matches!(status_of(dir, 100), CheckpointStatus::Damaged(r) if r.contains("does not match its position")));
    fs::write(&index, &good).unwrap();
    assert!(matches!(status_of(dir, 100), CheckpointStatus::Complete(_)));
}

/// A shard whose bytes match the index's size and checksum but whose content
/// contradicts the index (here: ps 1's file stored as ps 0's) is damaged too.
#[test]
fn a_shard_that_contradicts_the_index_is_damaged() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let infos: Vec<ShardInfo> = (0..2).map(|ps| write_shard(dir, 100, ps, 2, &shard(ps, 100)).unwrap()).collect();
    fs::copy(shard_path(dir, 100, 1, 2), shard_path(dir, 100, 0, 2)).unwrap();
    let mut swapped = infos[1].clone();
    swapped.ps_index = 0;
    swapped.file = shard_file_name(0, 2);
    write_index(dir, 100, 2, &[swapped, infos[1].clone()]).unwrap_err(); // layer1/* on both ps
    let mut renamed = infos[1].clone();
    renamed.ps_index = 0;
    renamed.file = shard_file_name(0, 2);
    renamed.variables.iter_mut().for_each(|v| v.name = format!("x/{}", v.name));
    write_index(dir, 100, 2, &[renamed, infos[1].clone()]).unwrap();
    match status_of(dir, 100) {
        CheckpointStatus::Damaged(reason) => {
            assert!(reason.contains("shard-00000-of-00002") && reason.contains("ps_index is \"1\""), "{reason}")
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_checkpoint_of_another_ps_count_is_found_and_read_whole() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    save(dir, 100, 2);
    // A job of 3 ps tasks finds it (each ps cuts its part out of every shard).
    let ckpt = latest_complete(dir).unwrap().unwrap();
    assert_eq!((ckpt.num_ps, ckpt.global_step), (2, 100));
    let all = read_all(&ckpt).unwrap();
    assert_eq!(all.variables.len(), 6);
    assert_eq!(all.dispatcher, read_shard(&ckpt, 0).unwrap().dispatcher, "the dispatcher's state comes with the merged shards");
}

#[test]
fn write_index_checks_the_shards_it_is_given() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let infos: Vec<ShardInfo> = (0..2).map(|ps| write_shard(dir, 100, ps, 2, &shard(ps, 100)).unwrap()).collect();
    let index = checkpoint_path(dir, 100).join("index.json");
    let is_invalid = |r: Result<PathBuf, CheckpointError>, what: &str| match r {
        Err(e @ CheckpointError::InvalidArgument { .. }) => assert!(e.to_string().contains(what), "{e}"),
        other => panic!("expected InvalidArgument containing {what:?}, got {other:?}"),
    };
    assert!(matches!(write_index(dir, 100, 2, &infos[..1]), Err(CheckpointError::Incomplete { reason, .. }) if reason.contains("ps 1")));
    is_invalid(write_index(dir, 100, 2, &[infos[0].clone(), infos[0].clone()]), "two shards for ps 0");
    is_invalid(write_index(dir, 100, 1, &infos[..1]), "with 2 ps tasks");
    is_invalid(write_index(dir, 101, 2, &infos), "not step 101");
    is_invalid(write_index(dir, 100, 0, &[]), "num_ps is 0");
    is_invalid(write_index(dir, -1, 2, &infos), "negative");
    let mut out_of_range = infos[1].clone();
    out_of_range.ps_index = 5;
    is_invalid(write_index(dir, 100, 2, &[infos[0].clone(), out_of_range]), "not in 0..2");
    let mut wrong_size = infos[1].clone();
    wrong_size.bytes += 1;
    assert!(matches!(write_index(dir, 100, 2, &[infos[0].clone(), wrong_size]), Err(CheckpointError::Damaged { .. })));
    assert!(!index.exists(), "a refused index must not be written");
    fs::remove_file(shard_path(dir, 100, 1, 2)).unwrap();
    assert!(matches!(write_index(dir, 100, 2, &infos), Err(CheckpointError::Incomplete { reason, .. }) if reason.contains("missing")));
    assert!(!index.exists());
}

#[test]
fn bad_shard_data_is_refused_before_anything_is_written() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("ckpts");
    let mut bad_shape = shard(0, 1);
    bad_shape.variables[0].1 = vec![4, 4];
    let mut dup = shard(0, 1);
    dup.slots.push(dup.variables[1].clone());
    let mut dup_update = shard(0, 1);
    dup_update.slots.push(("layer0/w:updates".into(), vec![1], vec![1.0]));
    let mut empty = shard(0, 1);
    empty.variables[0].0.clear();
    let mut overflow = shard(0, 1);
    overflow.variables[0].1 = vec![usize::MAX, 2];
    for (data, what) in
        [(&bad_shape, "does not hold 6 values"), (&dup, "used twice"), (&dup_update, "used twice"), (&empty, "empty name"), (&overflow, "does not hold")]
    {
        let err = write_shard(&dir, 1, 0, 2, data).unwrap_err();
        assert!(matches!(err, CheckpointError::InvalidArgument { .. }) && err.to_string().contains(what), "{what}: {err}");
    }
    assert!(write_shard(&dir, 1, 2, 2, &shard(0, 1)).unwrap_err().to_string().contains("not in 0..2"));
    assert!(write_shard(&dir, -5, 0, 2, &shard(0, 1)).unwrap_err().to_string().contains("negative"));
    assert!(!dir.exists(), "nothing may be created for refused data");
}

#[test]
fn empty_shards_and_scalars_round_trip() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let empty = ShardData::default();
    let scalar = ShardData { variables: vec![("global_step".into(), vec![], vec![42.0])], ..Default::default() };
    let infos = vec![write_shard(dir, 9, 0, 2, &empty).unwrap(), write_shard(dir, 9, 1, 2, &scalar).unwrap()];
    write_index(dir, 9, 2, &infos).unwrap();
    let ckpt = latest_complete(dir).unwrap().unwrap();
    assert_eq!(read_shard(&ckpt, 0).unwrap(), empty);
    assert_eq!(read_shard(&ckpt, 1).unwrap(), scalar);
}

#[test]
fn prune_keeps_the_last_k_complete() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    for step in [100, 200, 300, 400, 500] {
        save(dir, step, 1);
    }
    // 350: damaged, between complete ones; 450: incomplete, between; 600: incomplete, newest (maybe in progress).
    save(dir, 350, 1);
    fs::write(shard_path(dir, 350, 0, 1), b"garbage").unwrap();
    write_shard(dir, 450, 0, 1, &shard(0, 450)).unwrap();
    write_shard(dir, 600, 0, 1, &shard(0, 600)).unwrap();

    let deleted = prune(dir, 2).unwrap();
    let deleted_steps: Vec<i64> = deleted.iter().map(|p| parse_dir_name(p.file_name().unwrap().to_str().unwrap()).unwrap()).collect();
    assert_eq!(deleted_steps, [100, 200, 300, 350, 450]);
    assert_eq!(steps(dir), [400, 500, 600]);
    assert!(deleted.iter().all(|p| !p.exists()));
    assert_eq!(prune(dir, 2).unwrap(), Vec::<PathBuf>::new());

    // keep_last 0 still never deletes the newest complete one.
    prune(dir, 0).unwrap();
    assert_eq!(steps(dir), [500, 600]);
    assert_eq!(latest_complete(dir).unwrap().unwrap().global_step, 500);

    // Only incomplete checkpoints: nothing is deleted.
    let other = tmp.path().join("other");
    write_shard(&other, 1, 0, 2, &shard(0, 1)).unwrap();
    write_shard(&other, 2, 0, 2, &shard(0, 2)).unwrap();
    assert!(prune(&other, 1).unwrap().is_empty());
    assert_eq!(steps(&other), [1, 2]);
    assert!(prune(&tmp.path().join("absent"), 1).unwrap().is_empty());
}

#[test]
fn ps_tasks_write_their_shards_into_one_checkpoint_concurrently() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("ckpts");
    let num_ps = 8;
    let big = |ps: usize| ShardData {
        variables: vec![(format!("v{ps}"), vec![256, 64], (0..256 * 64).map(|i| (i * (ps + 1)) as f32).collect())],
        slots: vec![(format!("v{ps}:slot0"), vec![256, 64], vec![ps as f32; 256 * 64])],
        updates: vec![(format!("v{ps}"), ps as u64)],
        ..Default::default()
    };
    for round in 0..3i64 {
        let step = 10 + round;
        let barrier = std::sync::Barrier::new(num_ps);
        let infos: Vec<ShardInfo> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..num_ps)
                .map(|ps| {
                    let (dir, barrier, data) = (&dir, &barrier, big(ps));
                    s.spawn(move || {
                        barrier.wait();
                        write_shard(dir, step, ps, num_ps, &data).unwrap()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        write_index(&dir, step, num_ps, &infos).unwrap();
    }
    let ckpt = latest_complete(&dir).unwrap().unwrap();
    assert_eq!(ckpt.global_step, 12);
    for ps in 0..num_ps {
        assert_eq!(read_shard(&ckpt, ps).unwrap(), big(ps));
    }
    assert!(list(&dir).unwrap().iter().all(|l| matches!(l.status, CheckpointStatus::Complete(_))));
}

#[test]
fn rewriting_a_step_never_touches_a_complete_checkpoint_but_repairs_a_damaged_one() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    save(dir, 100, 2);
    let before = fs::read(shard_path(dir, 100, 0, 2)).unwrap();
    let err = write_shard(dir, 100, 0, 2, &shard(0, 999)).unwrap_err();
    assert!(matches!(err, CheckpointError::AlreadyComplete { .. }), "{err}");
    assert_eq!(fs::read(shard_path(dir, 100, 0, 2)).unwrap(), before);

    // A damaged checkpoint at the same step (say from a run that crashed) is replaced.
    fs::write(shard_path(dir, 100, 1, 2), b"junk").unwrap();
    let mut new0 = shard(0, 100);
    new0.variables[0].2[0] = 1234.5;
    let i0 = write_shard(dir, 100, 0, 2, &new0).unwrap();
    assert!(matches!(status_of(dir, 100), CheckpointStatus::Incomplete(_)), "the stale index must be gone");
    let i1 = write_shard(dir, 100, 1, 2, &shard(1, 100)).unwrap();
    write_index(dir, 100, 2, &[i1, i0]).unwrap();
    let ckpt = latest_complete(dir).unwrap().unwrap();
    assert_eq!(read_shard(&ckpt, 0).unwrap(), new0);
}

#[test]
fn inspect_lists_checkpoints_steps_and_variables() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    assert!(inspect(dir).unwrap().starts_with("no checkpoints in "));
    save(dir, 100, 2);
    save(dir, 200, 2);
    fs::remove_file(shard_path(dir, 200, 1, 2)).unwrap();
    write_shard(dir, 300, 0, 2, &shard(0, 300)).unwrap();
    let text = inspect(dir).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].starts_with("3 checkpoint(s) in ") && lines[0].ends_with("latest complete: step 100"), "{text}");
    assert!(lines[1].starts_with("ckpt-0000000100  step 100  complete  2 shard(s)"), "{text}");
    assert!(text.contains("  ps 1  shard-00001-of-00002.safetensors"), "{text}");
    assert!(text.contains("    variable  layer1/w  [2, 3]"), "{text}");
    assert!(text.contains("    variable  scale0  []"), "{text}");
    assert!(text.contains("    slot      layer0/w:slot1  [2, 3]"), "{text}");
    assert!(text.contains("    updates   layer0/b"), "{text}");
    assert!(
        text.contains("  data: 1 epoch(s) complete, next shard at epoch 1 position 0 of 10, 0 shard(s) in flight (trained again on restore), 100 examples trained, 2 shard(s) redone"),
        "{text}"
    );
    assert!(text.contains("ckpt-0000000200  step 200  DAMAGED: shard-00001-of-00002.safetensors"), "{text}");
    assert!(text.contains("ckpt-0000000300  step 300  INCOMPLETE: no index.json"), "{text}");
}

#[test]
fn utc_formatting() {
    assert_eq!(format_utc(0), "1970-01-01T00:00:00Z");
    assert_eq!(format_utc(951_782_400), "2000-02-29T00:00:00Z");
    assert_eq!(format_utc(951_868_799), "2000-02-29T23:59:59Z");
    assert_eq!(format_utc(951_868_800), "2000-03-01T00:00:00Z");
    assert_eq!(format_utc(1_700_000_000), "2023-11-14T22:13:20Z");
    assert_eq!(format_utc(4_107_542_400), "2100-03-01T00:00:00Z");
}
