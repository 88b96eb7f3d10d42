//! Where a job's state lives over its ps tasks, as a versioned layout, and what must move when the
//! number of ps tasks changes (issue 26, elastic parameter servers). `row_owner` is the
//! `consistent` partition strategy of embeddings; the dense re-placement (`Layout::resized`) is
//! not used by a move yet (a move re-runs the byte-balancing placement over the new ps count).
//!
//! - Embedding rows: a row's owner is the jump consistent hash (Lamping and Veach, "A Fast,
//!   Minimal Memory, Consistent Hash Algorithm", 2014) of its id over the ps count
//!   ([`crate::hash::row_owner`]). Going from N to
//!   N+1 ps moves about 1/(N+1) of the rows, all of them to the new ps; going from N+1 to N moves
//!   only the rows of the removed ps (the highest index, as a scale-down removes). `id % N` would
//!   move about N/(N+1) of them. Written here rather than taken from a crate: it is ten lines, and
//!   the answer must never change under us (a checkpoint records which rows a ps holds).
//! - Dense variables (and partitions): each stays where it is while its ps exists; those of a
//!   removed ps go to the least-loaded ones, largest first; a new ps takes variables from the
//!   most-loaded ones while that lowers the largest load. Balance comes within one variable of
//!   ideal, moving little more than the ideal number of bytes.
//!
//! Every task computes the same answer from the same inputs: nothing depends on iteration order
//! beyond names, which are sorted.

use std::collections::BTreeMap;

pub use crate::hash::row_owner;

/// A dense variable (or one partition of one) and its size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DenseItem {
    pub name: String,
    pub bytes: usize,
}

/// Where every dense item lives, for one ps count; the version goes up with every change. It
/// serialises as JSON, for a checkpoint to carry it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Layout {
    pub version: u64,
    pub num_ps: usize,
    /// Item name → ps index.
    pub dense: BTreeMap<String, usize>,
}

/// What changing the layout moves.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Moves {
    /// (item, from ps, to ps), sorted by item name.
    pub dense: Vec<(String, usize, usize)>,
    pub dense_bytes: usize,
}

impl Layout {
    /// The first layout: items placed largest first on the least-loaded ps (ties: the lower
    /// index), as the byte-balancing placement does.
    pub fn initial(items: &[DenseItem], num_ps: usize) -> Layout {
        let mut layout = Layout { version: 1, num_ps: num_ps.max(1), dense: BTreeMap::new() };
        let mut loads = vec![0usize; layout.num_ps];
        for item in largest_first(items) {
            let ps = least_loaded(&loads, None);
            loads[ps] += item.bytes;
            layout.dense.insert(item.name.clone(), ps);
        }
        layout
    }

    /// The bytes of `items` on each ps under this layout (items it does not place count nowhere).
    pub fn loads(&self, items: &[DenseItem]) -> Vec<usize> {
        let mut loads = vec![0usize; self.num_ps];
        for item in items {
            if let Some(&ps) = self.dense.get(&item.name) {
                loads[ps] += item.bytes;
            }
        }
        loads
    }

    /// The layout for `num_ps` ps tasks (the highest indices removed, or new ones added), moving
    /// as little as keeps the loads balanced; items this layout does not place yet are placed.
    pub fn resized(&self, items: &[DenseItem], num_ps: usize) -> Layout {
        let num_ps = num_ps.max(1);
        let mut next = Layout { version: self.version + 1, num_ps, dense: BTreeMap::new() };
        let mut loads = vec![0usize; num_ps];
        let mut homeless = Vec::new();
        for item in largest_first(items) {
            match self.dense.get(&item.name) {
                Some(&ps) if ps < num_ps => {
                    loads[ps] += item.bytes;
                    next.dense.insert(item.name.clone(), ps);
                }
                _ => homeless.push(item),
            }
        }
        for item in homeless {
            let ps = least_loaded(&loads, None);
            loads[ps] += item.bytes;
            next.dense.insert(item.name.clone(), ps);
        }
        if num_ps > self.num_ps {
            next.fill_new(items, &mut loads, self.num_ps);
        }
        next
    }

    /// New ps tasks (`first_new..`) take items from the most-loaded ones, smallest useful first,
    /// while that lowers the larger of the two loads.
    fn fill_new(&mut self, items: &[DenseItem], loads: &mut [usize], first_new: usize) {
        let by_name: BTreeMap<&str, usize> = items.iter().map(|i| (i.name.as_str(), i.bytes)).collect();
        loop {
            let to = least_loaded(loads, Some(first_new));
            let from = (0..loads.len()).max_by_key(|&p| (loads[p], std::cmp::Reverse(p))).unwrap_or(0);
            // The item of `from` whose move leaves the pair most even, if it lowers the larger load.
            let best = self
                .dense
                .iter()
                .filter(|&(_, &ps)| ps == from)
                .map(|(name, _)| (name.clone(), by_name[name.as_str()]))
                .filter(|(_, bytes)| loads[to] + bytes < loads[from])
                .min_by_key(|(name, bytes)| ((loads[from] - bytes).abs_diff(loads[to] + bytes), name.clone()));
            let Some((name, bytes)) = best else { break };
            loads[from] -= bytes;
            loads[to] += bytes;
            self.dense.insert(name, to);
        }
    }

    /// The dense items that move from this layout to `next`.
    pub fn moves_to(&self, next: &Layout, items: &[DenseItem]) -> Moves {
        let mut moves = Moves::default();
        for item in items {
            if let (Some(&from), Some(&to)) = (self.dense.get(&item.name), next.dense.get(&item.name))
                && from != to
            {
                moves.dense.push((item.name.clone(), from, to));
                moves.dense_bytes += item.bytes;
            }
        }
        moves.dense.sort();
        moves
    }
}

/// The embedding rows ps `me` holds (`ids`) that belong elsewhere once the ps count goes from
/// `old_ps` to `new_ps`, by new owner. Growing, rows leave only for the new ps tasks; shrinking,
/// only a removed ps (`me >= new_ps`) gives any away.
pub fn rows_to_move(ids: &[i64], me: usize, old_ps: usize, new_ps: usize) -> BTreeMap<usize, Vec<i64>> {
    let mut out: BTreeMap<usize, Vec<i64>> = BTreeMap::new();
    if old_ps == new_ps {
        return out;
    }
    for &id in ids {
        let owner = row_owner(id as u64, new_ps);
        if owner != me {
            out.entry(owner).or_default().push(id);
        }
    }
    out
}

/// `ids` cut into runs of at most `max_bytes` of rows `row_bytes` wide (one row at least per
/// run): a move is streamed in messages of bounded size, never one huge one.
pub fn chunks(ids: &[i64], row_bytes: usize, max_bytes: usize) -> impl Iterator<Item = &[i64]> {
    ids.chunks((max_bytes / row_bytes.max(1)).max(1))
}

fn largest_first(items: &[DenseItem]) -> Vec<&DenseItem> {
    let mut sorted: Vec<&DenseItem> = items.iter().collect();
    sorted.sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| a.name.cmp(&b.name)));
    sorted
}

/// The least-loaded ps (the lowest index on ties), among those from `from` on when given.
fn least_loaded(loads: &[usize], from: Option<usize>) -> usize {
    (from.unwrap_or(0)..loads.len()).min_by_key(|&p| (loads[p], p)).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// N → N±1 moves about the ideal fraction of rows: 1/(N+1) up, 1/(N+1) of the N+1 down, and
    /// every moved row goes to (up) or comes from (down) the ps that changed.
    #[test]
    fn rows_move_about_the_ideal_fraction() {
        let rows = 200_000u64;
        for n in 1..8usize {
            let moved: Vec<(usize, usize)> = (0..rows).map(|id| (row_owner(id, n), row_owner(id, n + 1))).filter(|(a, b)| a != b).collect();
            let fraction = moved.len() as f64 / rows as f64;
            let ideal = 1.0 / (n + 1) as f64;
            assert!((fraction - ideal).abs() < 0.01, "{n} -> {}: {fraction:.4} of the rows moved, ideal {ideal:.4}", n + 1);
            assert!(moved.iter().all(|&(_, to)| to == n), "{n} -> {}: a row moved between old ps tasks", n + 1);
            // Balance: each ps of n + 1 holds about 1/(n + 1) of the rows.
            let mut counts = vec![0u64; n + 1];
            (0..rows).for_each(|id| counts[row_owner(id, n + 1)] += 1);
            let want = rows as f64 / (n + 1) as f64;
            assert!(counts.iter().all(|&c| (c as f64 - want).abs() / want < 0.03), "{} ps: {counts:?}", n + 1);
        }
        assert_eq!(row_owner(12345, 0), 0);
        assert_eq!(row_owner(12345, 1), 0);
        // `id % n` for comparison: 1 -> 2 moves half, 3 -> 4 three quarters.
        let modulo = (0..rows).filter(|id| id % 3 != id % 4).count() as f64 / rows as f64;
        assert!(modulo > 0.7, "{modulo}");
    }

    fn items(sizes: &[usize]) -> Vec<DenseItem> {
        sizes.iter().enumerate().map(|(i, &bytes)| DenseItem { name: format!("v{i:02}"), bytes }).collect()
    }

    /// Growing and shrinking keep the loads within one item of ideal and move little more than
    /// the ideal bytes; items stay put where they can; versions go up.
    #[test]
    fn dense_items_rebalance_moving_little() {
        let cases: [(&[usize], usize, usize); 6] = [
            (&[100; 12], 2, 3),
            (&[100; 12], 3, 2),
            (&[400, 300, 200, 100, 100, 100, 50, 50, 25, 25], 1, 2),
            (&[400, 300, 200, 100, 100, 100, 50, 50, 25, 25], 4, 3),
            (&[1000, 10, 10, 10], 2, 4),
            (&[64; 40], 1, 5),
        ];
        for (sizes, from, to) in cases {
            let items = items(sizes);
            let before = Layout::initial(&items, from);
            let after = before.resized(&items, to);
            assert_eq!((after.version, after.num_ps), (before.version + 1, to));
            assert_eq!(after.dense.len(), items.len(), "every item placed");
            let total: usize = sizes.iter().sum();
            let largest = *sizes.iter().max().unwrap();
            let loads = after.loads(&items);
            let ideal = total.div_ceil(to);
            assert!(loads.iter().all(|&l| l <= ideal.max(largest) + largest), "{sizes:?} {from} -> {to}: loads {loads:?}, ideal {ideal}");
            let moves = before.moves_to(&after, &items);
            // The ideal: what the removed ps held (down), or what the new ones must hold (up).
            let ideal_moved = if to < from { before.loads(&items)[to..].iter().sum::<usize>() } else { total * (to - from) / to };
            assert!(moves.dense_bytes <= ideal_moved + largest, "{sizes:?} {from} -> {to}: moved {} bytes, ideal {ideal_moved}", moves.dense_bytes);
            // Up: nothing moves between old ps tasks; down: only the removed ones' items move.
            for (name, f, t) in &moves.dense {
                assert!(if to > from { *t >= from } else { *f >= to }, "{sizes:?} {from} -> {to}: {name} moved {f} -> {t}");
            }
            // And back again: the same count gives balanced loads again.
            let back = after.resized(&items, from);
            let back_loads = back.loads(&items);
            assert!(back_loads.iter().all(|&l| l <= total.div_ceil(from).max(largest) + largest), "{sizes:?} back to {from}: {back_loads:?}");
        }
    }

    /// A ps's rows after a change: what it keeps plus what it sends is what it had; each row
    /// sent goes to its new owner, and only where it must.
    #[test]
    fn a_ps_sends_exactly_the_rows_it_no_longer_owns() {
        let cases = [(2usize, 3usize), (3, 2), (1, 4), (4, 1), (3, 3)];
        for (old_ps, new_ps) in cases {
            for me in 0..old_ps {
                let held: Vec<i64> = (0..20_000i64).filter(|&id| row_owner(id as u64, old_ps) == me).collect();
                let moves = rows_to_move(&held, me, old_ps, new_ps);
                let sent: usize = moves.values().map(Vec::len).sum();
                let kept = held.iter().filter(|&&id| row_owner(id as u64, new_ps) == me).count();
                assert_eq!(kept + sent, held.len(), "{old_ps} -> {new_ps}, ps {me}");
                for (&to, ids) in &moves {
                    assert!(ids.iter().all(|&id| row_owner(id as u64, new_ps) == to), "{old_ps} -> {new_ps}: ps {me} sends to the wrong ps");
                    assert!(if new_ps > old_ps { to >= old_ps } else { me >= new_ps }, "{old_ps} -> {new_ps}: ps {me} sends to {to}");
                }
            }
        }
        let ids: Vec<i64> = (0..10).collect();
        let runs: Vec<usize> = chunks(&ids, 64, 256).map(<[i64]>::len).collect();
        assert_eq!(runs, [4, 4, 2]);
        assert_eq!(chunks(&ids, 1024, 256).count(), 10, "one row per message at least");
    }

    #[test]
    fn a_layout_is_the_same_wherever_it_is_computed() {
        let mut items = items(&[400, 300, 200, 100, 100, 100]);
        let a = Layout::initial(&items, 3).resized(&items, 4);
        items.reverse();
        let b = Layout::initial(&items, 3).resized(&items, 4);
        assert_eq!(a, b);
        let new_item = DenseItem { name: "w_new".into(), bytes: 50 };
        let with_new = a.resized(&[items.clone(), vec![new_item]].concat(), 4);
        assert!(with_new.dense.contains_key("w_new"), "an item the layout did not place is placed");
        let json = serde_json::to_string(&with_new).unwrap();
        assert_eq!(serde_json::from_str::<Layout>(&json).unwrap(), with_new, "{json}");
    }
}
