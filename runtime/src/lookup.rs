//! The rows of a step on their way to and from the ps tasks: which ids of a
//! batch each ps holds, the contents of a sparse push (ids, then the rows'
//! gradients), and the rows a pull brings back, put where the model expects
//! them.
//!
//! A worker holds a sparse embedding as the rows of the batch at hand, in
//! the order of the batch's sorted unique ids ([`crate::model::Model::row_ids`]).
//! Each ps holds the partition its strategy gives it; the ids asked of a ps
//! are the batch's ids in that partition, in the same (sorted) order, and
//! it answers rows in the order asked. Pure functions over plain data; the
//! client ([`crate::client`]) wires them to gRPC and the tensor channel.

use crate::le;
use crate::placement::RowPartition;

/// One embedding partition as a worker addresses it.
#[derive(Debug, Clone, PartialEq)]
pub struct TablePart {
    /// Index of the embedding among the model's variables.
    pub var: usize,
    /// The partition's stored name (`<variable>/part_<k>`).
    pub stored_name: String,
    pub partition: RowPartition,
    pub dim: usize,
}

impl TablePart {
    /// Positions (into the batch's sorted ids of this embedding) of the ids
    /// this partition holds, in order.
    pub fn positions(&self, ids: &[i64]) -> Vec<usize> {
        let p = &self.partition;
        ids.iter().enumerate().filter(|(_, id)| p.strategy.partition_of(p.rows, p.count, **id as u64) == p.index).map(|(k, _)| k).collect()
    }
}

/// The positions of a batch's sorted ids that each partition of `partition`'s
/// table holds, in order: `routes[k]` for partition `k` (of
/// `partition.count`). It computes each id's owner once; asking every
/// partition for its positions ([`TablePart::positions`]) computes it once
/// per partition, and a step asks for the pushed rows, the pulled rows and
/// the rows taken in (the consistent hash was 9 % of a 2-ps sparse job's
/// time so: BENCHMARKS.md).
pub fn route_ids(partition: &RowPartition, ids: &[i64]) -> Vec<Vec<usize>> {
    let p = partition;
    // Each its own capacity (`vec![v; n]` clones, and a clone keeps none of it).
    let share = ids.len() / p.count.max(1) as usize + 1;
    let mut routes: Vec<Vec<usize>> = (0..p.count).map(|_| Vec::with_capacity(share)).collect();
    for (k, &id) in ids.iter().enumerate() {
        if let Some(route) = routes.get_mut(p.strategy.partition_of(p.rows, p.count, id as u64) as usize) {
            route.push(k);
        }
    }
    routes
}

/// The ids at `positions`, as little-endian bytes (a pull's request).
pub fn ids_at(ids: &[i64], positions: &[usize]) -> Vec<u8> {
    let picked: Vec<i64> = positions.iter().map(|&k| ids[k]).collect();
    le::i64_bytes(&picked)
}

/// A sparse push's content for one partition: the ids at `positions`, then
/// their rows of `grads` (`ids.len() * dim` values, row after row), as
/// little-endian bytes.
pub fn push_content(ids: &[i64], grads: &[f32], dim: usize, positions: &[usize]) -> Vec<u8> {
    let mut out = ids_at(ids, positions);
    out.reserve(positions.len() * dim * 4);
    for &k in positions {
        for v in &grads[k * dim..(k + 1) * dim] {
            out.extend_from_slice(&v.to_le_bytes());
        }
    }
    out
}

/// The same content cut into pieces of at most `part_bytes` (at least one
/// row each; one empty piece when there is no row): (row count, bytes).
pub fn push_pieces(ids: &[i64], grads: &[f32], dim: usize, positions: &[usize], part_bytes: usize) -> Vec<(u64, Vec<u8>)> {
    let per_piece = (part_bytes / (8 + 4 * dim)).max(1);
    if positions.is_empty() {
        return vec![(0, Vec::new())];
    }
    positions.chunks(per_piece).map(|chunk| (chunk.len() as u64, push_content(ids, grads, dim, chunk))).collect()
}

/// Takes in the rows one partition sends back for a pull, piece by piece,
/// checking that they are the ids asked for, in order, and writing each
/// row where the batch's order puts it.
#[derive(Debug)]
pub struct RowsReceiver<'a> {
    name: &'a str,
    dim: usize,
    ids: &'a [i64],
    positions: &'a [usize],
    next: usize,
}

impl<'a> RowsReceiver<'a> {
    pub fn new(name: &'a str, dim: usize, ids: &'a [i64], positions: &'a [usize]) -> Self {
        RowsReceiver { name, dim, ids, positions, next: 0 }
    }

    /// One piece: `count` ids then their values (little-endian), into `dst`
    /// (the embedding's rows of the batch, `ids.len() * dim` values).
    pub fn take(&mut self, count: u64, content: &[u8], dst: &mut [f32]) -> Result<(), String> {
        let dim = self.dim;
        let count = usize::try_from(count).map_err(|_| format!("rows of {:?}: {count} rows", self.name))?;
        if self.next + count > self.positions.len() || content.len() != count * (8 + 4 * dim) {
            return Err(format!(
                "rows of {:?}: a piece of {count} row(s) and {} bytes does not fit the {} row(s) of dim {dim} asked for ({} received)",
                self.name,
                content.len(),
                self.positions.len(),
                self.next
            ));
        }
        let (ids, values) = content.split_at(count * 8);
        for (j, (id, row)) in ids.chunks_exact(8).zip(values.chunks_exact(4 * dim.max(1))).enumerate() {
            let k = self.positions[self.next + j];
            let id = le::i64_at(id);
            if id != self.ids[k] {
                return Err(format!("rows of {:?}: got id {id} where {} was asked for", self.name, self.ids[k]));
            }
            crate::tensor::copy_f32_from_le(&mut dst[k * dim..(k + 1) * dim], row);
        }
        self.next += count;
        Ok(())
    }

    /// Every row asked for came.
    pub fn finish(&self) -> Result<(), String> {
        if self.next == self.positions.len() {
            Ok(())
        } else {
            Err(format!("rows of {:?}: {} of the {} row(s) asked for came", self.name, self.next, self.positions.len()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::placement::PartitionStrategy;

    fn table(var: usize, strategy: PartitionStrategy, index: u64) -> TablePart {
        TablePart { var, stored_name: format!("e/part_{index}"), partition: RowPartition { strategy, index, count: 2, rows: 10 }, dim: 2 }
    }

    /// Each id of the batch goes to exactly one partition; the rows come
    /// back where the batch's order puts them, whatever the strategy.
    #[test]
    fn rows_go_to_their_partition_and_come_back_in_place() {
        let ids = vec![0i64, 3, 4, 5, 8, 9];
        let grads: Vec<f32> = (0..12).map(|x| x as f32).collect();
        for strategy in [PartitionStrategy::Mod, PartitionStrategy::Div, PartitionStrategy::Consistent] {
            let parts = [table(0, strategy, 0), table(0, strategy, 1)];
            let positions: Vec<Vec<usize>> = parts.iter().map(|p| p.positions(&ids)).collect();
            assert_eq!(route_ids(&parts[0].partition, &ids), positions, "{strategy}: routed in one pass as asked one by one");
            let mut all: Vec<usize> = positions.concat();
            all.sort();
            assert_eq!(all, (0..ids.len()).collect::<Vec<_>>(), "{strategy}: every id once");
            let want = match strategy {
                PartitionStrategy::Mod => vec![vec![0, 2, 4], vec![1, 3, 5]],
                PartitionStrategy::Div => vec![vec![0, 1, 2], vec![3, 4, 5]],
                PartitionStrategy::Consistent => {
                    let of = |k: usize| (0..ids.len()).filter(|&i| crate::hash::row_owner(ids[i] as u64, 2) == k).collect::<Vec<_>>();
                    vec![of(0), of(1)]
                }
            };
            assert_eq!(positions, want, "{strategy}");
            // The ps answers with the content a push would carry: ids then rows.
            let mut dst = vec![0f32; 12];
            for (p, pos) in parts.iter().zip(&positions) {
                let content = push_content(&ids, &grads, 2, pos);
                let mut r = RowsReceiver::new(&p.stored_name, 2, &ids, pos);
                // In two pieces: one row, then the rest.
                let cut = 8 + 8;
                let first_piece = [&content[..8], &content[8 * pos.len()..8 * pos.len() + 8]].concat();
                let rest = [&content[8..8 * pos.len()], &content[8 * pos.len() + 8..]].concat();
                assert_eq!(first_piece.len(), cut);
                r.take(1, &first_piece, &mut dst).unwrap();
                assert!(r.finish().is_err(), "not all rows yet");
                r.take(pos.len() as u64 - 1, &rest, &mut dst).unwrap();
                r.finish().unwrap();
            }
            assert_eq!(dst, grads, "{strategy}: every row in its place");
        }
    }

    /// Routing in one pass gives each partition the positions it would
    /// pick for itself, for every strategy, with more partitions than two
    /// and ids that skip rows.
    #[test]
    fn one_pass_routes_as_every_partition_would_pick() {
        let ids: Vec<i64> = (0..3_000i64).map(|k| k * 7 + k % 3).collect();
        for strategy in [PartitionStrategy::Mod, PartitionStrategy::Div, PartitionStrategy::Consistent] {
            for count in [1u64, 3, 5] {
                let part = |index| RowPartition { strategy, index, count, rows: 21_000 };
                let one_by_one: Vec<Vec<usize>> =
                    (0..count).map(|k| TablePart { var: 0, stored_name: String::new(), partition: part(k), dim: 1 }.positions(&ids)).collect();
                let routed = route_ids(&part(0), &ids);
                assert_eq!(routed, one_by_one, "{strategy}, {count} partitions");
                assert_eq!(routed.iter().map(Vec::len).sum::<usize>(), ids.len(), "{strategy}, {count}: every id once");
            }
        }
    }

    #[test]
    fn wrong_answers_are_named() {
        let ids = vec![1i64, 3];
        let pos = vec![0, 1];
        let mut dst = vec![0f32; 4];
        let swapped = push_content(&[3, 1], &[0.0; 4], 2, &[0, 1]);
        let err = RowsReceiver::new("e/part_1", 2, &ids, &pos).take(2, &swapped, &mut dst).unwrap_err();
        assert!(err.contains("got id 3 where 1 was asked for"), "{err}");
        let err = RowsReceiver::new("e/part_1", 2, &ids, &pos).take(3, &[0u8; 48], &mut dst).unwrap_err();
        assert!(err.contains("does not fit the 2 row(s)"), "{err}");
        let err = RowsReceiver::new("e/part_1", 2, &ids, &pos).take(2, &[0u8; 10], &mut dst).unwrap_err();
        assert!(err.contains("10 bytes"), "{err}");
    }

    #[test]
    fn pushes_are_cut_into_pieces_of_whole_rows() {
        let ids: Vec<i64> = (0..5).collect();
        let grads = vec![1.0f32; 10];
        let pos: Vec<usize> = (0..5).collect();
        // A row is 8 + 2 * 4 = 16 bytes: 40-byte pieces hold 2 rows.
        let pieces = push_pieces(&ids, &grads, 2, &pos, 40);
        assert_eq!(pieces.iter().map(|(n, b)| (*n, b.len())).collect::<Vec<_>>(), vec![(2, 32), (2, 32), (1, 16)]);
        assert_eq!(push_pieces(&ids, &grads, 2, &[], 40), vec![(0, vec![])], "no row: one empty piece");
        assert_eq!(push_pieces(&ids, &grads, 2, &pos, 1).len(), 5, "at least one row per piece");
    }
}
