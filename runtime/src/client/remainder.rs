//! An async push that a move cut in two: the ps tasks that froze for the
//! move after it reached them had applied it (their state moved with it),
//! the others refused it. Pushing it again whole would apply the first part
//! twice; taking the step again would too. What is owed is the part the
//! refusing ps tasks held under the old layout, cut for the new one and
//! pushed as a remainder (`PushGradientsRequest.remainder`): its parts may
//! cover part of a variable, and it is applied, not counted as a step.
//!
//! [`owed`] (which rows and elements) is pure; `PsSet::join_step` and
//! [`PsSet::push_remainder`] wire it.

use std::future::Future;
use std::ops::Range;
use std::sync::atomic::Ordering;

use futures::future::{join_all, try_join_all};
use ndarray::ArrayD;

use super::{CALL_DEADLINE, ClientError, PsSet, Rows, deadline, without_retry};
use crate::lookup;
use crate::proto;
use crate::tensor;

/// What a cut push still owes, per model variable: the element ranges of a
/// dense variable, the positions (into the batch's ids) of an embedding's
/// rows, that ps tasks which refused it held.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Owed {
    pub dense: Vec<Vec<Range<usize>>>,
    pub rows: Vec<Vec<usize>>,
}

impl Owed {
    pub fn is_empty(&self) -> bool {
        self.dense.iter().all(Vec::is_empty) && self.rows.iter().all(Vec::is_empty)
    }
}

/// What the ps tasks of `old` marked in `refused` held of a push of the
/// batch's rows `rows`.
pub fn owed(old: &PsSet, refused: &[bool], rows: Rows<'_>) -> Owed {
    let n = old.variables.len();
    let mut out = Owed { dense: vec![Vec::new(); n], rows: vec![Vec::new(); n] };
    for ps in (0..old.num_ps()).filter(|&ps| refused.get(ps).copied().unwrap_or(false)) {
        for (vi, shard) in &old.shards[ps] {
            out.dense[*vi].push(old.element_range(*vi, shard));
        }
        for t in &old.tables[ps] {
            out.rows[t.var].extend(t.positions(&rows[t.var]));
        }
    }
    out.dense.iter_mut().for_each(|r| r.sort_by_key(|r| r.start));
    out.rows.iter_mut().for_each(|p| p.sort_unstable());
    out
}

/// The parts of `range` (elements of a variable) that fall in `piece`
/// (the elements a ps holds of it), relative to the piece.
fn overlap(range: &Range<usize>, piece: &Range<usize>) -> Option<Range<usize>> {
    let (start, end) = (range.start.max(piece.start), range.end.min(piece.end));
    (start < end).then(|| start - piece.start..end - piece.start)
}

impl PsSet {
    /// Awaits a step's calls to every ps. Sync: the first error ends it (as
    /// before). Async: every call is awaited, so that a push a move cut in
    /// two is known for what it is ([`ClientError::CutByMove`], with the ps
    /// tasks that applied it: `applied` of their answer).
    pub(super) async fn join_step<T, F>(&self, calls: impl IntoIterator<Item = F>, applied: impl Fn(&T) -> bool) -> Result<Vec<T>, ClientError>
    where
        F: Future<Output = Result<T, ClientError>>,
    {
        if self.config.mode() == proto::UpdateMode::Sync {
            return try_join_all(calls).await;
        }
        let results = join_all(calls).await;
        if results.iter().all(Result::is_ok) {
            return Ok(results.into_iter().flatten().collect());
        }
        let mask: Vec<bool> = results.iter().map(|r| r.as_ref().is_ok_and(&applied)).collect();
        let cause = results.into_iter().find_map(Result::err).expect("an error");
        if mask.iter().any(|&a| a) && cause.is_layout_change() {
            return Err(ClientError::CutByMove { applied: mask, cause: Box::new(cause) });
        }
        Err(cause)
    }

    /// Pushes what `owed` says of `gradients` (of the batch's rows `rows`)
    /// to the ps tasks of this (the new) layout that hold it, as a
    /// remainder. Returns the bytes pushed.
    pub async fn push_remainder(&self, owed: &Owed, gradients: &[ArrayD<f32>], rows: Rows<'_>) -> Result<u64, ClientError> {
        let push_id = self.next_push_id.fetch_add(1, Ordering::Relaxed);
        let messages: Vec<Vec<proto::PushGradientsRequest>> =
            (0..self.num_ps()).map(|ps| self.remainder_messages(ps, push_id, owed, gradients, rows)).collect();
        let bytes =
            messages.iter().flatten().map(|m| m.part.as_ref().map_or(0, |p| p.content.len()) + m.rows.as_ref().map_or(0, |r| r.content.len())).sum::<usize>();
        let calls = messages.into_iter().enumerate().filter(|(_, m)| !m.is_empty()).map(|(ps, messages)| {
            let client = self.clients[ps].clone();
            without_retry(ps, &self.addresses[ps], "push the rest of a cut push to", move || {
                let mut c = client.clone();
                let stream = tokio_stream::iter(messages.clone());
                async move { c.push_gradients(deadline(stream, CALL_DEADLINE)).await.map(|r| r.into_inner()) }
            })
        });
        try_join_all(calls).await?;
        Ok(bytes as u64)
    }

    /// The remainder's messages for ps `ps` (none when it holds nothing owed).
    fn remainder_messages(&self, ps: usize, push_id: u64, owed: &Owed, gradients: &[ArrayD<f32>], rows: Rows<'_>) -> Vec<proto::PushGradientsRequest> {
        let header = |first: bool| proto::PushGradientsRequest {
            task: if first { self.task_proto() } else { None },
            push_id,
            layout_version: self.layout_version,
            remainder: true,
            ..Default::default()
        };
        let mut messages = Vec::new();
        for (vi, shard) in &self.shards[ps] {
            let piece = self.element_range(*vi, shard);
            let all = gradients[*vi].as_slice().expect("standard layout");
            for range in owed.dense[*vi].iter().filter_map(|r| overlap(r, &piece)) {
                let values = &all[piece.start + range.start..piece.start + range.end];
                for mut part in tensor::encode_parts(&shard.stored_name, &tensor::wire_shape(&shard.shape), values, self.part_bytes) {
                    part.offset += range.start as u64;
                    messages.push(proto::PushGradientsRequest { part: Some(part), ..header(messages.is_empty()) });
                }
            }
        }
        for t in &self.tables[ps] {
            let ids = &rows[t.var];
            let positions: Vec<usize> = t.positions(ids).into_iter().filter(|k| owed.rows[t.var].binary_search(k).is_ok()).collect();
            if positions.is_empty() {
                continue;
            }
            let grads = gradients[t.var].as_slice().expect("standard layout");
            for (count, content) in lookup::push_pieces(ids, grads, t.dim, &positions, self.part_bytes) {
                let piece = proto::RowsPart { name: t.stored_name.clone(), count, content: content.into() };
                messages.push(proto::PushGradientsRequest { rows: Some(piece), ..header(messages.is_empty()) });
            }
        }
        messages
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};
    use std::time::Duration;

    use ndarray::ArrayD;

    use super::{PsSet, overlap, owed};
    use crate::client::ModelVariable;
    use crate::cluster::TaskId;
    use crate::init::Init;
    use crate::placement::{self, PartitionStrategy, PlacementInput};
    use crate::proto;

    #[test]
    fn the_owed_part_of_a_piece_is_cut_relative_to_it() {
        // (owed range, piece held, what the piece is pushed)
        let cases = [
            (0..10, 0..10, Some(0..10)),
            (0..10, 5..20, Some(0..5)),
            (12..30, 5..20, Some(7..15)),
            (0..5, 5..20, None),
            (20..25, 5..20, None),
            (6..8, 5..20, Some(1..3)),
        ];
        for (range, piece, want) in cases {
            assert_eq!(overlap(&range, &piece), want, "{range:?} of {piece:?}");
        }
    }

    /// `w` [40, 4] cut over the ps tasks, `b` [4] whole, `e` a 1000 x 4 embedding.
    fn ps_set(num_ps: usize) -> PsSet {
        let dense =
            |name: &str, shape: Vec<usize>| (PlacementInput { name: name.into(), shape: shape.clone(), embedding: None }, ModelVariable::dense(name, shape));
        let (w, b) = (dense("w", vec![40, 4]), dense("b", vec![4]));
        let e_input = PlacementInput { name: "e".into(), shape: vec![1000, 4], embedding: Some(PartitionStrategy::Consistent) };
        let e = ModelVariable { name: "e".into(), shape: vec![1000, 4], rows: Some((Init::Zeros, 1)) };
        let placement = placement::place(&[w.0, b.0, e_input], num_ps, 256).unwrap();
        let addresses: Vec<String> = (0..num_ps).map(|i| format!("127.0.0.1:{}", 1 + i)).collect();
        let config = proto::TrainingConfig { mode: proto::UpdateMode::Async as i32, ..Default::default() };
        let credentials = crate::auth::Credentials { token: None, tls: None };
        PsSet::new(TaskId::new("worker", 0), &addresses, &credentials, vec![w.1, b.1, e], placement, config, Duration::from_secs(1)).unwrap()
    }

    /// What a remainder pushes: each dense variable's elements (by index,
    /// with the value pushed) and each embedding's rows (by id, first value).
    fn pushed(new: &PsSet, messages: Vec<Vec<proto::PushGradientsRequest>>) -> (BTreeMap<(usize, usize), f32>, BTreeMap<i64, f32>) {
        let (mut dense, mut rows) = (BTreeMap::new(), BTreeMap::new());
        for (ps, list) in messages.into_iter().enumerate() {
            for m in list {
                assert!(m.remainder && m.layout_version == new.layout_version);
                if let Some(part) = m.part {
                    let (vi, shard) = new.shards[ps].iter().find(|(_, s)| s.stored_name == part.name).unwrap();
                    let start = new.element_range(*vi, shard).start + part.offset as usize;
                    for (k, v) in crate::le::f32s(&part.content).into_iter().enumerate() {
                        assert!(dense.insert((*vi, start + k), v).is_none(), "element {} of variable {vi} pushed twice", start + k);
                    }
                }
                if let Some(r) = m.rows {
                    let n = r.count as usize;
                    let (ids, values) = (crate::le::i64s(&r.content[..n * 8]), crate::le::f32s(&r.content[n * 8..]));
                    for (k, id) in ids.into_iter().enumerate() {
                        assert!(rows.insert(id, values[k * 4]).is_none(), "row {id} pushed twice");
                    }
                }
            }
        }
        (dense, rows)
    }

    /// A push cut by a move from 2 to 3 ps tasks: the rest pushed to the new
    /// ones is exactly what the refusing ps tasks held, with its values, each
    /// element and row once; what ps 0 and what ps 1 refused make the whole.
    #[tokio::test]
    async fn the_rest_of_a_cut_push_is_what_the_refusing_ps_tasks_held() {
        let (old, new) = (ps_set(2), ps_set(3));
        let ids: Vec<i64> = vec![1, 5, 17, 200, 321, 654, 999];
        let rows = vec![Vec::new(), Vec::new(), ids.clone()];
        let seq = |n: usize, k: f32| (0..n).map(|i| k + i as f32).collect::<Vec<f32>>();
        let gradients = vec![
            ArrayD::from_shape_vec(vec![40, 4], seq(160, 0.0)).unwrap(),
            ArrayD::from_shape_vec(vec![4], seq(4, 1000.0)).unwrap(),
            ArrayD::from_shape_vec(vec![ids.len(), 4], (0..ids.len() * 4).map(|i| (i / 4) as f32 + 0.5).collect()).unwrap(),
        ];
        let mut halves = Vec::new();
        for refused in [[true, false], [false, true], [true, true]] {
            let owed = owed(&old, &refused, &rows);
            let messages = (0..3).map(|ps| new.remainder_messages(ps, 7, &owed, &gradients, &rows)).collect();
            let (dense, got_rows) = pushed(&new, messages);
            for ((vi, k), v) in &dense {
                assert_eq!(*v, gradients[*vi].as_slice().unwrap()[*k], "{refused:?}: variable {vi} element {k}");
                assert!(owed.dense[*vi].iter().any(|r| r.contains(k)), "{refused:?}: variable {vi} element {k} was not owed");
            }
            let owed_elements: usize = owed.dense.iter().flatten().map(|r| r.len()).sum();
            assert_eq!(dense.len(), owed_elements, "{refused:?}: every owed element pushed");
            let want_rows: BTreeSet<i64> = owed.rows[2].iter().map(|&k| ids[k]).collect();
            assert_eq!(got_rows.keys().copied().collect::<BTreeSet<_>>(), want_rows, "{refused:?}");
            for (id, v) in &got_rows {
                assert_eq!(*v, ids.iter().position(|x| x == id).unwrap() as f32 + 0.5, "{refused:?}: row {id}");
            }
            halves.push((dense.keys().copied().collect::<BTreeSet<_>>(), want_rows));
        }
        let (a, b, all) = (&halves[0], &halves[1], &halves[2]);
        assert!(a.0.is_disjoint(&b.0) && a.1.is_disjoint(&b.1), "ps 0 and ps 1 held different parts");
        assert_eq!(a.0.union(&b.0).copied().collect::<BTreeSet<_>>(), all.0);
        assert_eq!(a.1.union(&b.1).copied().collect::<BTreeSet<_>>(), all.1);
        assert_eq!(all.0.len(), 164, "both refused: every element of w and b");
        assert_eq!(all.1.len(), ids.len(), "both refused: every row");
        assert!(!a.0.is_empty() && !b.0.is_empty(), "w is cut over both ps tasks");
    }
}
