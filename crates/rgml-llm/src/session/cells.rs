//! Which position each cell of one sequence's KV cache holds, for the global layers (every
//! position kept) and for the local (sliding-window) ones.
//!
//! Local layers only ever see their window, so their cache holds the window and one
//! micro-batch (rounded up to 256 cells) instead of the whole context, and reuses cells whose
//! positions fell out of the window. Where a position goes decides the order in which the
//! attention sums over cells, so this module places them exactly as llama.cpp's cache does
//! (`llama_kv_cache::find_slot` and `apply_ubatch`, one sequence per stream): the logits stay
//! equal to llama.cpp's for prompts and generations of any length. A global layer's table is
//! the same with an endless window: appending to a sequence fills cell `p` with position `p`.
//!
//! This module owns that bookkeeping, the masks, and removing and shifting positions; it
//! touches no tensors.

use crate::error::{LlmError, Result};

/// The cells of one layer kind's cache of one sequence.
#[derive(Clone, Debug)]
pub(super) struct Cells {
    /// The position each cell holds (`None`: empty).
    pos: Vec<Option<usize>>,
    /// Where the next search starts (after the last cell written).
    head: usize,
    /// Positions a token sees: itself and the `window - 1` before it (`usize::MAX`: all).
    window: usize,
}

/// The window of a global layer's table: every earlier position is seen.
pub(super) const NO_WINDOW: usize = usize::MAX;

/// llama.cpp's cache size for its local layers: the window and a micro-batch, rounded up to
/// 256 cells, at most the whole context's cells.
pub(super) fn local_cache_cells(window: usize, n_ubatch: usize, cells: usize) -> usize {
    window
        .saturating_add(n_ubatch)
        .min(cells)
        .next_multiple_of(256)
        .min(cells)
}

impl Cells {
    pub(super) fn new(size: usize, window: usize) -> Cells {
        Cells {
            pos: vec![None; size],
            head: 0,
            window,
        }
    }

    /// Become a copy of `other`, reusing this one's memory (decoding allocates nothing).
    pub(super) fn copy_from(&mut self, other: &Cells) {
        self.pos.clone_from(&other.pos);
        self.head = other.head;
        self.window = other.window;
    }

    pub(super) fn clear(&mut self) {
        self.pos.fill(None);
        self.head = 0;
    }

    /// Cells holding a position.
    pub(super) fn used(&self) -> usize {
        self.pos.iter().filter(|p| p.is_some()).count()
    }

    /// Cells in the table.
    pub(super) fn size(&self) -> usize {
        self.pos.len()
    }

    /// The position after the newest one held (0 when empty): where the sequence goes on.
    pub(super) fn next_pos(&self) -> usize {
        self.pos.iter().flatten().max().map_or(0, |&p| p + 1)
    }

    /// Forget the positions in `range`. The head goes back to the first cell freed, as
    /// llama.cpp's does: a sequence cut back and continued fills the same cells as one that
    /// was never longer.
    pub(super) fn remove(&mut self, range: std::ops::Range<usize>) {
        for (cell, p) in self.pos.iter_mut().enumerate() {
            if p.is_some_and(|p| range.contains(&p)) {
                *p = None;
                self.head = self.head.min(cell);
            }
        }
    }

    /// Move the positions in `range` by `delta` (those that would go below 0 are forgotten);
    /// `moved` gets each moved cell with its delta (for the K-shift). The head goes back to the
    /// start, as llama.cpp's does after a shift.
    pub(super) fn shift(
        &mut self,
        range: std::ops::Range<usize>,
        delta: isize,
        moved: &mut Vec<(usize, isize)>,
    ) {
        moved.clear();
        for (cell, p) in self.pos.iter_mut().enumerate() {
            let Some(old) = *p else { continue };
            if !range.contains(&old) {
                continue;
            }
            *p = old.checked_add_signed(delta);
            if p.is_some() {
                moved.push((cell, delta));
            }
        }
        self.head = 0;
    }

    /// Hold, in the same cells, the positions in `range` that `src` holds (their K and V are
    /// copied along by the caller); what these cells held is forgotten. The cells copied.
    pub(super) fn copy_range(
        &mut self,
        src: &Cells,
        range: std::ops::Range<usize>,
        copied: &mut Vec<usize>,
    ) {
        copied.clear();
        for (cell, (dst, &p)) in self.pos.iter_mut().zip(&src.pos).enumerate() {
            if p.is_some_and(|p| range.contains(&p)) {
                *dst = p;
                copied.push(cell);
            }
        }
    }

    /// Cells up to the last used one (the attention reads them; the rest are empty).
    pub(super) fn used_max_p1(&self) -> usize {
        self.pos
            .iter()
            .rposition(|p| p.is_some())
            .map_or(0, |i| i + 1)
    }

    /// Whether a cell at position `cell_pos` is out of the window of a token at `pos`.
    pub(super) fn out_of_window(&self, cell_pos: usize, pos: usize) -> bool {
        pos.saturating_sub(cell_pos) >= self.window && pos > cell_pos
    }

    /// The cells `n` new tokens go to, into `found`: free ones, or ones out of the window of
    /// the position after the newest held, found from the head on, wrapping (llama.cpp's
    /// search without the contiguity requirement).
    fn find_slot(&self, n: usize, found: &mut Vec<i32>) -> Result<()> {
        let size = self.pos.len();
        let full = || LlmError::BadConfig(format!("the KV cache's {size} cells are full"));
        if n > size {
            return Err(full());
        }
        let next_pos = self.next_pos();
        let mut head = self.head;
        // As llama.cpp: plenty of unused cells before the head, so search from the start.
        if head > self.used() + 2 * n {
            head = 0;
        }
        found.clear();
        let mut tested = 0;
        while found.len() < n {
            if tested >= size {
                return Err(full());
            }
            if head >= size {
                head = 0;
            }
            let usable = match self.pos[head] {
                None => true,
                Some(p) => self.out_of_window(p, next_pos),
            };
            if usable {
                let cell = i32::try_from(head)
                    .map_err(|_| LlmError::BadConfig(format!("{size} cells are too many")))?;
                found.push(cell);
            }
            head += 1;
            tested += 1;
        }
        Ok(())
    }

    /// Place `n` tokens at positions `first..first + n`; `cells` gets the cells they went to.
    /// Positions up to the newest one overwritten are dropped (the cache keeps every position
    /// between its oldest and newest, as llama.cpp's does).
    pub(super) fn place(&mut self, first: usize, n: usize, cells: &mut Vec<i32>) -> Result<()> {
        self.find_slot(n, cells)?;
        let mut dropped: Option<usize> = None;
        for (i, c) in cells.iter().map(|&c| c as usize).enumerate() {
            if let Some(old) = self.pos[c] {
                dropped = Some(dropped.map_or(old, |d: usize| d.max(old)));
            }
            self.pos[c] = Some(first + i);
        }
        if let Some(max_dropped) = dropped {
            for p in self.pos.iter_mut() {
                if p.is_some_and(|p| p <= max_dropped) {
                    *p = None;
                }
            }
        }
        if let Some(&last) = cells.last() {
            self.head = last as usize + 1;
        }
        Ok(())
    }

    /// The mask `[n_kv, n]` of the tokens at `first..first + n` over the first `n_kv` cells:
    /// 0 where the cell holds a position the token sees (not in its future, within its
    /// window), else -inf.
    #[cfg(test)]
    fn mask(&self, n_kv: usize, first: usize, n: usize, out: &mut Vec<f32>) {
        out.clear();
        out.resize(n_kv * n, f32::NEG_INFINITY);
        self.mask_rows(n_kv, first, true, out);
    }

    /// [`Cells::mask`] into `out` (`n_kv` times the tokens, all -inf); without `causal`,
    /// every held position is seen (an encoder's bidirectional attention).
    pub(super) fn mask_rows(&self, n_kv: usize, first: usize, causal: bool, out: &mut [f32]) {
        for (i, row) in out.chunks_exact_mut(n_kv).enumerate() {
            let pos = first + i;
            for (m, cell) in row.iter_mut().zip(&self.pos) {
                let seen = |c: usize| !causal || c <= pos && !self.out_of_window(c, pos);
                if cell.is_some_and(seen) {
                    *m = 0.0;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The cells `n` tokens at `first..` go to.
    fn place(c: &mut Cells, first: usize, n: usize) -> Result<Vec<i32>> {
        let mut cells = Vec::new();
        c.place(first, n, &mut cells).map(|()| cells)
    }

    #[test]
    fn cells_fill_in_order_then_reuse_what_left_the_window() {
        // A window of 4 in 8 cells, filled by micro-batches of 3.
        let mut c = Cells::new(8, 4);
        assert_eq!(place(&mut c, 0, 3).unwrap(), [0, 1, 2]);
        assert_eq!(place(&mut c, 3, 3).unwrap(), [3, 4, 5]);
        // Positions 0 and 1 are out of the window of position 6: reused after the head.
        assert_eq!(place(&mut c, 6, 3).unwrap(), [6, 7, 0]);
        assert_eq!(c.pos[0], Some(8));
        // Overwriting position 0 drops nothing older; the held range stays whole.
        let held: Vec<usize> = c.pos.iter().flatten().copied().collect();
        let (lo, hi) = (*held.iter().min().unwrap(), *held.iter().max().unwrap());
        assert_eq!(held.len(), hi - lo + 1);
        assert_eq!(c.used_max_p1(), 8);
    }

    #[test]
    fn the_mask_sees_the_window_and_the_past_only() {
        let mut c = Cells::new(8, 3);
        place(&mut c, 0, 5).unwrap();
        let mut m = Vec::new();
        c.mask(8, 3, 2, &mut m);
        let row =
            |r: usize| -> Vec<bool> { m[r * 8..r * 8 + 8].iter().map(|x| *x == 0.0).collect() };
        // Position 3 sees 1, 2, 3; position 4 sees 2, 3, 4; empty cells are masked.
        assert_eq!(
            row(0),
            [false, true, true, true, false, false, false, false]
        );
        assert_eq!(
            row(1),
            [false, false, true, true, true, false, false, false]
        );
    }

    #[test]
    fn a_full_cache_is_an_error() {
        // Position 0 has left the window of position 4: its cell is reused.
        let mut c = Cells::new(4, 4);
        place(&mut c, 0, 4).unwrap();
        assert_eq!(place(&mut c, 4, 1).unwrap(), [0]);
        // With a window of 8, every held position is still seen: no cell is free.
        let mut c = Cells::new(4, 8);
        place(&mut c, 0, 4).unwrap();
        assert!(place(&mut c, 4, 1).is_err());
        assert!(place(&mut Cells::new(4, 8), 0, 5).is_err());
    }

    #[test]
    fn cache_size_is_window_and_ubatch_rounded() {
        assert_eq!(local_cache_cells(512, 512, 2048), 1024);
        assert_eq!(local_cache_cells(512, 512, 768), 768);
        assert_eq!(local_cache_cells(8, 512, 1024), 768);
    }
}
