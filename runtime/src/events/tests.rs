use super::*;

fn only_file(dir: &Path) -> PathBuf {
    let files: Vec<PathBuf> = fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(files.len(), 1, "{files:?}");
    files.into_iter().next().unwrap()
}

fn write_sample(dir: &Path) -> PathBuf {
    let mut w = EventWriter::create(dir, ".chief").unwrap();
    w.add_scalar("loss", 2.5, 1).unwrap();
    w.add_scalars(2, &[("loss", 1.25), ("accuracy", 0.5), ("global_step/sec", 40.0)]).unwrap();
    w.add_scalar("loss", 0.0, 3).unwrap();
    let path = w.path().to_path_buf();
    w.close().unwrap();
    path
}

#[test]
fn file_name_follows_tensorflow() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_sample(&dir.path().join("logs"));
    let name = path.file_name().unwrap().to_str().unwrap().to_string();
    let rest = name.strip_prefix("events.out.tfevents.").expect(&name);
    let (secs, host) = rest.split_once('.').unwrap();
    assert_eq!(secs.len(), 10, "{name}");
    let secs: u64 = secs.parse().unwrap();
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs();
    assert!(secs <= now && now - secs < 600, "{secs} vs {now}");
    assert!(host.ends_with(".chief"), "{name}");
    assert!(host.len() > ".chief".len(), "no host name in {name}");
    assert_eq!(path.parent().unwrap(), dir.path().join("logs"));
}

#[test]
fn scalars_round_trip_and_first_record_is_file_version() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_sample(dir.path());

    let events = read_events(&path).unwrap();
    assert_eq!(events.len(), 4);
    assert_eq!(events[0].what, Some(What::FileVersion("brain.Event:2".to_string())));
    let now = now_secs();
    for e in &events {
        assert!(e.wall_time > now - 600.0 && e.wall_time <= now, "{e:?}");
    }
    assert!(events.windows(2).all(|w| w[0].wall_time <= w[1].wall_time));

    let got = scalars(&path).unwrap();
    let want = vec![
        ("loss".to_string(), 1, 2.5),
        ("loss".to_string(), 2, 1.25),
        ("accuracy".to_string(), 2, 0.5),
        ("global_step/sec".to_string(), 2, 40.0),
        ("loss".to_string(), 3, 0.0),
    ];
    assert_eq!(got, want);
}

/// The bytes must be what protobuf produces for TensorFlow's field numbers, so
/// check them by hand rather than only through our own decoder.
#[test]
fn encoding_matches_event_proto_field_numbers() {
    let first = Event { wall_time: 1.5, step: 0, what: Some(What::FileVersion(FILE_VERSION.into())) };
    let mut want = vec![0x09]; // field 1, fixed64
    want.extend_from_slice(&1.5f64.to_le_bytes());
    want.extend_from_slice(&[0x1a, 13]); // field 3, length-delimited, 13 bytes
    want.extend_from_slice(b"brain.Event:2");
    assert_eq!(first.encode_to_vec(), want);

    let summary = Event {
        wall_time: 2.0,
        step: 300,
        what: Some(What::Summary(Summary { value: vec![SummaryValue { tag: "loss".into(), value: Some(Value::SimpleValue(0.0)) }] })),
    };
    let mut want = vec![0x09];
    want.extend_from_slice(&2.0f64.to_le_bytes());
    want.extend_from_slice(&[0x10, 0xac, 0x02]); // field 2, varint 300
    // field 5 (Summary), 13 bytes: field 1 (Value), 11 bytes: tag "loss" + simple_value 0.0
    want.extend_from_slice(&[0x2a, 13, 0x0a, 11, 0x0a, 4, b'l', b'o', b's', b's', 0x15, 0, 0, 0, 0]);
    assert_eq!(summary.encode_to_vec(), want);
}

#[test]
fn record_framing_is_tfrecord() {
    let rec = encode_record(b"abc");
    assert_eq!(rec.len(), 3 + 16);
    assert_eq!(&rec[..8], &3u64.to_le_bytes());
    assert_eq!(u32::from_le_bytes(rec[8..12].try_into().unwrap()), masked_crc32c(&3u64.to_le_bytes()));
    // Cross-checked with TensorBoard's own `masked_crc32c(struct.pack('<Q', 3))`.
    assert_eq!(u32::from_le_bytes(rec[8..12].try_into().unwrap()), 0x0E49_99B0);
    assert_eq!(&rec[12..15], b"abc");
    assert_eq!(u32::from_le_bytes(rec[15..19].try_into().unwrap()), masked_crc32c(b"abc"));
    let path = Path::new("mem");
    assert_eq!(read_records(path, &rec).unwrap(), vec![(0, &b"abc"[..])]);
    let mut two = rec.clone();
    two.extend(encode_record(b""));
    assert_eq!(read_records(path, &two).unwrap(), vec![(0, &b"abc"[..]), (19, &b""[..])]);
}

#[test]
fn a_flipped_data_byte_is_detected() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_sample(dir.path());
    let mut bytes = fs::read(&path).unwrap();
    let records = read_records(&path, &bytes).unwrap();
    let (offset, data) = records[2];
    let target = offset as usize + 12 + data.len() / 2;
    bytes[target] ^= 0x01;
    fs::write(&path, &bytes).unwrap();
    match read_events(&path) {
        Err(EventError::DataChecksum { offset: at, path: p, .. }) => {
            assert_eq!(at, offset);
            assert_eq!(p, path);
        }
        other => panic!("expected a data checksum error, got {other:?}"),
    }
    let msg = read_events(&path).unwrap_err().to_string();
    assert!(msg.contains("data checksum mismatch") && msg.contains(path.to_str().unwrap()), "{msg}");
}

#[test]
fn a_flipped_length_byte_is_detected() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_sample(dir.path());
    let mut bytes = fs::read(&path).unwrap();
    let second = read_records(&path, &bytes).unwrap()[1].0 as usize;
    bytes[second] ^= 0x40;
    fs::write(&path, &bytes).unwrap();
    assert!(matches!(read_events(&path), Err(EventError::LengthChecksum { offset, .. }) if offset == second as u64), "{:?}", read_events(&path));
}

#[test]
fn truncation_is_detected_at_every_cut() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_sample(dir.path());
    let bytes = fs::read(&path).unwrap();
    let starts: Vec<usize> = read_records(&path, &bytes).unwrap().iter().map(|r| r.0 as usize).collect();
    let cut_path = dir.path().join("cut");
    for cut in 1..bytes.len() {
        fs::write(&cut_path, &bytes[..cut]).unwrap();
        let result = read_events(&cut_path);
        if starts.contains(&cut) {
            // A cut on a record boundary leaves a shorter but valid file.
            assert_eq!(result.unwrap().len(), starts.iter().position(|&s| s == cut).unwrap());
        } else {
            let err = result.unwrap_err();
            assert!(matches!(err, EventError::Truncated { .. }), "cut at {cut}: {err}");
            assert!(err.to_string().contains("truncated record"), "{err}");
        }
    }
}

#[test]
fn a_record_that_is_not_an_event_is_a_decode_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("events.out.tfevents.bad");
    // Field 1 declared as fixed64 but only 3 bytes follow.
    fs::write(&path, encode_record(&[0x09, 1, 2, 3])).unwrap();
    assert!(matches!(read_events(&path), Err(EventError::Decode { offset: 0, .. })), "{:?}", read_events(&path));
}

#[test]
fn unknown_fields_of_other_writers_are_skipped() {
    // graph_def (field 4) and a histogram value (field 5 of Value) are not ours.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("events.out.tfevents.other");
    let graph = [0x09, 0, 0, 0, 0, 0, 0, 0xf0, 0x3f, 0x10, 7, 0x22, 2, 0xde, 0xad];
    let histo_and_scalar = [
        0x10, 8, 0x2a, 17, // step 8, Summary of 17 bytes
        0x0a, 5, 0x0a, 1, b'h', 0x2a, 0, // Value { tag "h", histo {} }
        0x0a, 8, 0x0a, 1, b's', 0x15, 0, 0, 0x80, 0x3f, // Value { tag "s", simple_value 1.0 }
    ];
    let mut bytes = encode_record(&graph);
    bytes.extend(encode_record(&histo_and_scalar));
    fs::write(&path, bytes).unwrap();
    let events = read_events(&path).unwrap();
    assert_eq!(events[0].step, 7);
    assert_eq!(events[0].wall_time, 1.0);
    assert_eq!(events[0].what, None);
    assert_eq!(scalars(&path).unwrap(), vec![("s".to_string(), 8, 1.0)]);
}

#[test]
fn a_missing_file_names_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nope");
    let err = read_events(&path).unwrap_err();
    assert!(matches!(err, EventError::Io { .. }));
    assert!(err.to_string().contains("nope"), "{err}");
}

#[test]
fn two_writers_in_the_same_second_get_distinct_files() {
    let dir = tempfile::tempdir().unwrap();
    let mut a = EventWriter::create(dir.path(), "").unwrap();
    let mut b = EventWriter::create(dir.path(), "").unwrap();
    assert_ne!(a.path(), b.path());
    a.add_scalar("a", 1.0, 1).unwrap();
    b.add_scalar("b", 2.0, 1).unwrap();
    let (pa, pb) = (a.path().to_path_buf(), b.path().to_path_buf());
    a.close().unwrap();
    b.close().unwrap();
    assert_eq!(scalars(&pa).unwrap(), vec![("a".to_string(), 1, 1.0)]);
    assert_eq!(scalars(&pb).unwrap(), vec![("b".to_string(), 1, 2.0)]);
    assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 2);
}

#[test]
fn records_become_visible_after_max_pending_without_close() {
    let dir = tempfile::tempdir().unwrap();
    let policy = FlushPolicy { interval: Duration::from_secs(3600), max_pending: 3 };
    let mut w = EventWriter::create_with(dir.path(), "", policy).unwrap();
    let path = only_file(dir.path());
    // The file_version record is flushed at creation.
    assert_eq!(read_events(&path).unwrap().len(), 1);
    w.add_scalar("x", 1.0, 1).unwrap();
    w.add_scalar("x", 2.0, 2).unwrap();
    assert_eq!(read_events(&path).unwrap().len(), 1, "flushed before max_pending");
    w.add_scalar("x", 3.0, 3).unwrap();
    assert_eq!(scalars(&path).unwrap().len(), 3);
    w.add_scalar("x", 4.0, 4).unwrap();
    w.flush().unwrap();
    assert_eq!(scalars(&path).unwrap().len(), 4);
    drop(w);
}

#[test]
fn the_background_flusher_writes_pending_records_after_the_interval() {
    let dir = tempfile::tempdir().unwrap();
    let policy = FlushPolicy { interval: Duration::from_millis(50), max_pending: 1000 };
    let mut w = EventWriter::create_with(dir.path(), "", policy).unwrap();
    w.add_scalar("x", 1.0, 1).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if scalars(w.path()).unwrap().len() == 1 {
            break;
        }
        assert!(Instant::now() < deadline, "the pending record was never flushed");
        std::thread::sleep(Duration::from_millis(20));
    }
    // No further add or flush call: the writer is still open.
    assert!(w.flusher.as_ref().is_some_and(|h| !h.is_finished()));
}

#[test]
fn drop_flushes() {
    let dir = tempfile::tempdir().unwrap();
    let policy = FlushPolicy { interval: Duration::from_secs(3600), max_pending: 1000 };
    let mut w = EventWriter::create_with(dir.path(), "", policy).unwrap();
    w.add_scalar("x", 1.0, 1).unwrap();
    let path = w.path().to_path_buf();
    drop(w);
    assert_eq!(scalars(&path).unwrap(), vec![("x".to_string(), 1, 1.0)]);
}

#[test]
fn bad_tags_and_suffixes_are_refused_and_write_nothing() {
    let dir = tempfile::tempdir().unwrap();
    assert!(matches!(EventWriter::create(dir.path(), "/x"), Err(EventError::InvalidSuffix { .. })));
    assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 0);
    let mut w = EventWriter::create(dir.path(), "").unwrap();
    assert!(matches!(w.add_scalar("", 1.0, 1), Err(EventError::InvalidTag { .. })));
    let err = w.add_scalars(1, &[("ok", 1.0), ("bad\n", 2.0)]).unwrap_err();
    assert!(err.to_string().contains("control character"), "{err}");
    w.add_scalars(1, &[]).unwrap();
    let path = w.path().to_path_buf();
    w.close().unwrap();
    assert_eq!(read_events(&path).unwrap().len(), 1);
}

#[test]
fn log_dir_that_is_a_file_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("file");
    fs::write(&file, b"x").unwrap();
    let err = EventWriter::create(&file, "").unwrap_err();
    assert!(matches!(err, EventError::Dir { .. }), "{err}");
    assert!(err.to_string().contains("event log directory"), "{err}");
}

/// The CRC-32C the `crc32c` crate computes (the hand-written one it
/// replaced passed the same tests): the check value, RFC 3720's vectors, a
/// bit-at-a-time reference for every length, and appending.
mod crc {
    use super::*;

    /// The reflected Castagnoli polynomial.
    const POLY: u32 = 0x82F6_3B78;

    fn crc32c(data: &[u8]) -> u32 {
        crc32c::crc32c(data)
    }

    /// Bit-at-a-time reference, written straight from the definition.
    fn slow(data: &[u8]) -> u32 {
        let mut c = 0xFFFF_FFFFu32;
        for &b in data {
            c ^= b as u32;
            for _ in 0..8 {
                c = if c & 1 != 0 { (c >> 1) ^ POLY } else { c >> 1 };
            }
        }
        !c
    }

    #[test]
    fn check_value() {
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
        assert_eq!(crc32c(b""), 0);
    }

    /// RFC 3720 (iSCSI), appendix B.4.
    #[test]
    fn rfc3720_vectors() {
        assert_eq!(crc32c(&[0u8; 32]), 0x8A91_36AA);
        assert_eq!(crc32c(&[0xFFu8; 32]), 0x62A8_AB43);
        let inc: Vec<u8> = (0..32).collect();
        assert_eq!(crc32c(&inc), 0x46DD_794E);
        let dec: Vec<u8> = (0..32).rev().collect();
        assert_eq!(crc32c(&dec), 0x113F_DB5C);
    }

    #[test]
    fn sliced_matches_bitwise_for_every_length_and_split() {
        let data: Vec<u8> = (0..300u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
        for len in 0..data.len() {
            assert_eq!(crc32c(&data[..len]), slow(&data[..len]), "len {len}");
        }
        let whole = crc32c(&data);
        for split in [0, 1, 7, 8, 9, 150, 299, 300] {
            assert_eq!(crc32c::crc32c_append(crc32c(&data[..split]), &data[split..]), whole, "split {split}");
        }
    }

    #[test]
    fn mask_is_rotate_plus_delta_and_inverts() {
        // 0xE3069283 rotated right by 15 = 0x2507C60D; + 0xA282EAD8 = 0xC78AB0E5.
        assert_eq!(mask(0xE306_9283), 0xC78A_B0E5);
        assert_eq!(mask(0), MASK_DELTA);
        for c in [0u32, 1, 0xE306_9283, 0xFFFF_FFFF, 0x8000_0000, 0x1234_5678] {
            assert_ne!(mask(c), c);
            assert_eq!(unmask(mask(c)), c);
        }
    }
}
