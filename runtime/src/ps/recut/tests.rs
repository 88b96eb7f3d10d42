//! Table tests of the re-cut: a checkpoint written under one placement, cut
//! for every ps of another, gives back every value, slot and row exactly.

use std::collections::BTreeMap;

use super::*;
use crate::checkpoint::NamedTensor;
use crate::init::{Init, RowInit};
use crate::placement::{PartitionStrategy, PlacementInput, place};

const DIM: usize = 4;

fn inputs(strategy: PartitionStrategy) -> Vec<PlacementInput> {
    vec![
        PlacementInput::dense("hidden/w", vec![40, 8]),
        PlacementInput::dense("hidden/b", vec![8]),
        PlacementInput::dense("out/w", vec![8, 1]),
        PlacementInput::dense("step_scale", vec![]),
        PlacementInput { name: "emb".into(), shape: vec![1000, DIM], embedding: Some(strategy) },
    ]
}

/// What ps `ps` holds under the placement of `inputs` over `num_ps`
/// (partitioned above 256 bytes, so `hidden/w` is cut).
fn pieces(inputs: &[PlacementInput], num_ps: usize, ps: usize) -> (Vec<DensePiece>, Vec<RowsPiece>) {
    let placement = place(inputs, num_ps, 256).unwrap();
    let (mut dense, mut rows) = (Vec::new(), Vec::new());
    for s in placement.shards_on(ps) {
        let whole = inputs.iter().find(|v| v.name == s.variable).unwrap();
        match s.partition {
            Some(p) => rows.push(RowsPiece {
                stored_name: s.stored_name.clone(),
                part: EmbeddingPart {
                    variable: s.variable.clone(),
                    rows: p.rows,
                    dim: DIM,
                    strategy: p.strategy,
                    partition: p.index,
                    num_partitions: p.count,
                    init: RowInit::new(&s.variable, Init::Zeros, 1),
                },
            }),
            None => dense.push(DensePiece {
                stored_name: s.stored_name.clone(),
                variable: s.variable.clone(),
                row_offset: s.rows.start,
                variable_rows: whole.shape.first().copied().unwrap_or(1),
                shape: s.shape.clone(),
            }),
        }
    }
    (dense, rows)
}

/// The value of element `i` of dense variable `name`, slot `k` (0: the value).
fn dense_value(name: &str, i: usize, k: usize) -> f32 {
    (name.len() * 1000 + i * 10 + k) as f32
}

/// The rows training materialised: every third id, and a few at the end.
fn materialised(rows: u64) -> impl Iterator<Item = i64> {
    (0..rows as i64).filter(move |id| id % 3 == 0 || *id > rows as i64 - 5)
}

fn row_value(id: i64, j: usize, k: usize) -> f32 {
    (id as usize * 100 + j * 10 + k) as f32 + 0.5
}

/// The checkpoint shard ps `ps` writes under the placement over `num_ps`.
fn written(inputs: &[PlacementInput], num_ps: usize, ps: usize) -> ShardData {
    let (dense, rows) = pieces(inputs, num_ps, ps);
    let mut data = ShardData::default();
    for d in dense {
        let row_len: usize = d.shape.get(1..).unwrap_or(&[]).iter().product();
        let n = d.shape.first().copied().unwrap_or(1);
        let at = |k| (d.row_offset * row_len..(d.row_offset + n) * row_len).map(|i| dense_value(&d.variable, i, k)).collect::<Vec<_>>();
        data.push_dense(&d.stored_name, &d.shape, &at(0), [&at(1), &at(2)], 7 + ps as u64);
    }
    for r in rows {
        let p = &r.part;
        let ids: Vec<i64> = materialised(p.rows).filter(|&id| p.strategy.partition_of(p.rows, p.num_partitions, id as u64) == p.partition).collect();
        let at = |k| ids.iter().flat_map(|&id| (0..DIM).map(move |j| row_value(id, j, k))).collect::<Vec<_>>();
        data.push_rows(&r.stored_name, DIM, (&ids, &at(0), [&at(1), &at(2)], 3), serde_json::to_string(p).unwrap());
    }
    if ps == 0 {
        data.dispatcher = Some("{\"epoch\":2}".into());
    }
    data
}

/// Every shard of a checkpoint merged (as `checkpoint::read_all` does).
fn merged(shards: Vec<ShardData>) -> ShardData {
    let mut all = ShardData::default();
    for s in shards {
        all.merge(s);
    }
    all
}

/// What a checkpoint says, independent of its layout: every dense tensor
/// (values and slots) whole, every embedding row by id (values and slots).
type Content = (BTreeMap<String, Vec<f32>>, BTreeMap<i64, Vec<f32>>);

/// `base[/part_k][:slotN]` as (`base[:slotN]`, k).
fn whole_name(stored: &str) -> (String, usize) {
    let (name, slot) = stored.split_once(':').map_or((stored, String::new()), |(n, s)| (n, format!(":{s}")));
    match name.rsplit_once("/part_") {
        Some((base, k)) => (format!("{base}{slot}"), k.parse().unwrap()),
        None => (format!("{name}{slot}"), 0),
    }
}

fn content(all: &ShardData) -> Content {
    let tensors: Vec<&NamedTensor> = all.variables.iter().chain(&all.slots).collect();
    let is_rows = |n: &str| all.row_ids.iter().any(|(r, _)| n.split(':').next() == Some(r.as_str()));
    let mut parts: BTreeMap<String, BTreeMap<usize, &[f32]>> = BTreeMap::new();
    for t in tensors.iter().filter(|t| !is_rows(&t.0)) {
        let (name, k) = whole_name(&t.0);
        assert!(parts.entry(name).or_default().insert(k, &t.2).is_none(), "{} stored twice", t.0);
    }
    let dense = parts.into_iter().map(|(n, p)| (n, p.values().flat_map(|v| v.iter().copied()).collect())).collect();
    let mut rows = BTreeMap::new();
    for (name, ids) in &all.row_ids {
        let tensor = |suffix: &str| tensors.iter().find(|t| t.0 == format!("{name}{suffix}")).map(|t| t.2.clone()).unwrap();
        let (values, s0, s1) = (tensor(""), tensor(":slot0"), tensor(":slot1"));
        for (i, &id) in ids.iter().enumerate() {
            let row: Vec<f32> = [&values, &s0, &s1].iter().flat_map(|v| v[i * DIM..(i + 1) * DIM].iter().copied()).collect();
            assert!(rows.insert(id, row).is_none(), "row {id} stored twice");
        }
    }
    (dense, rows)
}

#[test]
fn every_value_slot_and_row_survives_a_change_of_ps_count() {
    use PartitionStrategy::{Div, Mod};
    // (strategy, ps that wrote the checkpoint, ps that restore it)
    let cases = [(Mod, 1, 3), (Mod, 3, 2), (Div, 2, 5), (Div, 4, 1), (Mod, 2, 2), (Div, 3, 3)];
    for (strategy, from, to) in cases {
        let what = format!("{strategy} {from} -> {to}");
        let inputs = inputs(strategy);
        let before = merged((0..from).map(|ps| written(&inputs, from, ps)).collect());
        let after: Vec<ShardData> = (0..to)
            .map(|ps| {
                let (dense, rows) = pieces(&inputs, to, ps);
                recut(&before, &dense, &rows, ps == 0).unwrap_or_else(|e| panic!("{what}: ps {ps}: {e}"))
            })
            .collect();
        for (ps, shard) in after.iter().enumerate() {
            // Each restores as a ps shard of the new layout would: its
            // partitions hold only their own rows, each once.
            for (name, ids) in &shard.row_ids {
                let (_, json) = shard.embeddings.iter().find(|(n, _)| n == name).unwrap();
                let part: EmbeddingPart = serde_json::from_str(json).unwrap();
                let mut table = crate::embedding::RowTable::new(name, part);
                let t = |s: &str| shard.slots.iter().find(|x| x.0 == format!("{name}:{s}")).unwrap().2.clone();
                let values = shard.variables.iter().find(|x| &x.0 == name).unwrap().2.clone();
                table.restore(ids.clone(), values, [t("slot0"), t("slot1")], 3).unwrap_or_else(|e| panic!("{what}: ps {ps}: {e}"));
            }
            assert_eq!(shard.dispatcher.is_some(), ps == 0, "{what}: the dispatcher stays on ps 0");
        }
        assert_eq!(content(&merged(after.clone())), content(&before), "{what}: the same values, slots and rows");
        // Every new piece of `hidden/w` takes the largest update count of
        // the old ones it overlaps (7 + the index of the ps that wrote it).
        let (old, new) = (place(&inputs, from, 256).unwrap(), place(&inputs, to, 256).unwrap());
        for piece in &new.variables["hidden/w"] {
            let overlapping = old.variables["hidden/w"].iter().filter(|o| o.rows.start < piece.rows.end && piece.rows.start < o.rows.end);
            let want = overlapping.map(|o| 7 + o.ps as u64).max().unwrap();
            let got = after[piece.ps].updates.iter().find(|(n, _)| *n == piece.stored_name).unwrap().1;
            assert_eq!(got, want, "{what}: {}", piece.stored_name);
        }
    }
}

#[test]
fn a_checkpoint_of_another_model_is_refused_by_name() {
    let inputs = inputs(PartitionStrategy::Mod);
    let before = merged((0..2).map(|ps| written(&inputs, 2, ps)).collect());
    let (dense, rows) = pieces(&inputs, 3, 0);
    let renamed = DensePiece { variable: "hidden/v".into(), ..dense[0].clone() };
    let wider = DensePiece { variable_rows: 41, ..dense.iter().find(|d| d.variable == "hidden/w").unwrap().clone() };
    let mut narrower = rows[0].clone();
    narrower.part.dim = 3;
    let cases: Vec<(Vec<DensePiece>, Vec<RowsPiece>, &str)> = vec![
        (vec![renamed], vec![], "no variable \"hidden/v\""),
        (vec![wider], vec![], "40 rows stored, 41 in the model"),
        (vec![], vec![narrower], "1000x4 stored, 1000x3 in the model"),
    ];
    for (dense, rows, want) in cases {
        let err = recut(&before, &dense, &rows, false).unwrap_err().to_string();
        assert!(err.contains(want), "{err} (wanted {want:?})");
    }
}

/// The live case: every old ps supplies fragments from its own shard only,
/// every new ps assembles its pieces from all of them; what a ps keeps is
/// supplied by itself (it does not move). A source missing or counted
/// twice is an error naming the row.
#[test]
fn every_ps_supplies_its_own_fragments_and_the_new_pieces_are_whole() {
    use PartitionStrategy::{Div, Mod};
    for (strategy, from, to) in [(Mod, 1, 3), (Div, 3, 2), (Mod, 2, 4)] {
        let what = format!("{strategy} {from} -> {to}");
        let inputs = inputs(strategy);
        let before: Vec<ShardData> = (0..from).map(|ps| written(&inputs, from, ps)).collect();
        let mut after = Vec::new();
        let mut moved = 0;
        for ps in 0..to {
            let (dense, rows) = pieces(&inputs, to, ps);
            let supplied: Vec<Fragments> =
                (0..from).map(|old| fragments(&StoredPieces::of(&before[old]), &pieces(&inputs, from, old).0, &dense, &rows).unwrap()).collect();
            moved += supplied.iter().enumerate().filter(|(old, _)| *old != ps).map(|(_, f)| f.bytes()).sum::<usize>();
            after.push(assemble(&dense, &rows, supplied).unwrap_or_else(|e| panic!("{what}: ps {ps}: {e}")));
        }
        assert_eq!(content(&merged(after)), content(&merged(before.clone())), "{what}");
        let total: usize = before.iter().map(|s| s.variables.iter().chain(&s.slots).map(|t| t.2.len() * 4).sum::<usize>()).sum();
        assert!(moved > 0 && moved <= total, "{what}: moved {moved} of {total} bytes");
        // A lost source: the rows it held come from no ps.
        let (dense, rows) = pieces(&inputs, to, 0);
        let one: Vec<Fragments> =
            (0..from).map(|old| fragments(&StoredPieces::of(&before[old]), &pieces(&inputs, from, old).0, &dense, &rows).unwrap()).collect();
        if from > 1 {
            let err = assemble(&dense, &rows, one[..from - 1].to_vec()).unwrap_err().to_string();
            assert!(err.contains("came from no ps") || err.contains("no variable"), "{what}: {err}");
        }
        let twice = [one.clone(), one].concat();
        let err = assemble(&dense, &rows, twice).unwrap_err().to_string();
        assert!(err.contains("came twice"), "{what}: {err}");
    }
}
