//! Decoders of the 32-value blocks Q4_0, Q4_1, Q5_0 and Q5_1: their quants in element order.

/// A block's weight quants in element order (`q[j]`, `q[j + 16]` from byte j's nibbles), with
/// the fifth bits of `qh` when given, minus `offset`.
#[inline(always)]
pub(crate) fn legacy_quants(qs: &[u8; 16], qh: Option<[u8; 4]>, offset: i8) -> [i8; 32] {
    let qh = qh.map_or(0, u32::from_le_bytes);
    std::array::from_fn(|e| {
        let nibble = if e < 16 {
            qs[e] & 0x0F
        } else {
            qs[e - 16] >> 4
        };
        let high = ((qh >> e) & 1) as u8;
        (nibble | (high << 4)) as i8 - offset
    })
}
