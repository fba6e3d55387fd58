//! Intel AMX (Advanced Matrix Extensions) tile primitives: the process's permission to use the
//! tile state, the tile configuration, and the tile loads, stores and int8 dot products that
//! the AMX kernels need. Rust has no stable AMX intrinsics, so each instruction is one `asm!`
//! naming its tile registers literally (the compiler never allocates tile registers itself, so
//! the tile state is ours between the instructions of one kernel call).
//!
//! Linux keeps the tile data state (XTILEDATA) off until a process asks for it with
//! `arch_prctl(ARCH_REQ_XCOMP_PERM)`; an AMX instruction before that raises SIGILL. [`usable`]
//! asks once per process and says whether the kernels may run. Each kernel call configures the
//! tiles on its own thread ([`TileConfig::load`]) and releases them at the end ([`release`]),
//! so a worker thread that never runs an AMX kernel never carries the 8 KiB tile state.

use std::arch::asm;
use std::sync::OnceLock;

/// Whether this process may run AMX-INT8 instructions: the CPU has AMX-TILE and AMX-INT8, the
/// OS manages the tile state (XCR0), and the kernel granted it. Asked once per process.
pub(crate) fn usable() -> bool {
    static USABLE: OnceLock<bool> = OnceLock::new();
    *USABLE.get_or_init(|| cpu_has_amx_int8() && request_tile_data())
}

/// CPUID leaf 7's AMX-TILE and AMX-INT8 bits, and XCR0's tile state bits (17 and 18).
fn cpu_has_amx_int8() -> bool {
    use std::arch::x86_64::{__cpuid, __cpuid_count};
    const OSXSAVE: u32 = 1 << 27;
    const AMX_TILE: u32 = 1 << 24;
    const AMX_INT8: u32 = 1 << 25;
    const XCR0_TILE: u64 = 0b11 << 17;
    if __cpuid(0).eax < 7 || __cpuid(1).ecx & OSXSAVE == 0 {
        return false;
    }
    let edx = __cpuid_count(7, 0).edx;
    if edx & AMX_TILE == 0 || edx & AMX_INT8 == 0 {
        return false;
    }
    // SAFETY: OSXSAVE says XGETBV is enabled, and XCR0 (register 0) always exists then.
    let xcr0 = unsafe { xgetbv0() };
    xcr0 & XCR0_TILE == XCR0_TILE
}

/// XCR0.
///
/// # Safety
/// The CPU supports XSAVE and the OS enabled it (CPUID.1:ECX.OSXSAVE).
#[target_feature(enable = "xsave")]
unsafe fn xgetbv0() -> u64 {
    // SAFETY: as the caller promises.
    unsafe { std::arch::x86_64::_xgetbv(0) }
}

/// `arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`: permission for this process's threads
/// to use the tile data state (Linux 5.16 and later).
#[cfg(target_os = "linux")]
fn request_tile_data() -> bool {
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    // SAFETY: arch_prctl with this request only changes which extended states the process may
    // use; it reads and writes no memory of ours.
    unsafe {
        libc::syscall(
            libc::SYS_arch_prctl,
            ARCH_REQ_XCOMP_PERM,
            XFEATURE_XTILEDATA,
        ) == 0
    }
}

#[cfg(not(target_os = "linux"))]
fn request_tile_data() -> bool {
    false
}

/// A tile configuration (palette 1): rows and bytes per row of each of the 8 tile registers.
#[repr(C, align(64))]
pub(crate) struct TileConfig([u8; 64]);

impl TileConfig {
    /// Every tile unused.
    pub(crate) fn new() -> TileConfig {
        let mut c = [0u8; 64];
        c[0] = 1;
        TileConfig(c)
    }

    /// Tile `t` (0..8) holds `rows` rows (at most 16) of `bytes` bytes (at most 64).
    pub(crate) fn set(&mut self, t: usize, rows: u8, bytes: u16) {
        self.0[16 + 2 * t..18 + 2 * t].copy_from_slice(&bytes.to_le_bytes());
        self.0[48 + t] = rows;
    }

    /// Configure this thread's tiles (`ldtilecfg`), zeroing every tile.
    ///
    /// # Safety
    /// [`usable`] returned true; every tile is at most 16 rows of 64 bytes.
    pub(crate) unsafe fn load(&self) {
        // SAFETY: as the caller promises; the 64 bytes are readable.
        unsafe { asm!("ldtilecfg [{0}]", in(reg) self.0.as_ptr(), options(nostack, readonly)) };
    }
}

/// Return this thread's tiles to their initial state (`tilerelease`).
///
/// # Safety
/// [`usable`] returned true.
pub(crate) unsafe fn release() {
    // SAFETY: as the caller promises.
    unsafe { asm!("tilerelease", options(nostack, nomem)) };
}

/// The instruction `$op` on the tile register(s) the constants name, one `asm!` per
/// combination, so that each call compiles to the single instruction.
macro_rules! on_tiles {
    ($op:literal, $t:expr; $($n:literal),*) => {
        match $t {
            $($n => asm!(concat!($op, " tmm", $n), options(nostack)),)*
            _ => unreachable!("tile register out of range"),
        }
    };
    ($op:literal, $t:expr, $p:expr, $s:expr, load; $($n:literal),*) => {
        match $t {
            $($n => asm!(concat!($op, " tmm", $n, ", [{p} + {s}*1]"), p = in(reg) $p,
                s = in(reg) $s, options(nostack)),)*
            _ => unreachable!("tile register out of range"),
        }
    };
    ($op:literal, $t:expr, $p:expr, $s:expr, store; $($n:literal),*) => {
        match $t {
            $($n => asm!(concat!($op, " [{p} + {s}*1], tmm", $n), p = in(reg) $p,
                s = in(reg) $s, options(nostack)),)*
            _ => unreachable!("tile register out of range"),
        }
    };
    ($op:literal, $c:expr, $a:expr, $b:expr, dot; $(($cn:literal, $an:literal, $bn:literal)),*) => {
        match ($c, $a, $b) {
            $(($cn, $an, $bn) => asm!(concat!($op, " tmm", $cn, ", tmm", $an, ", tmm", $bn),
                options(nostack)),)*
            _ => unreachable!("tile registers out of range"),
        }
    };
}

/// The accumulator, A and B registers the dot products may name: accumulators 0..=3, A in 4
/// or 5, B in 6 or 7 (the two A tiles times the two B tiles into the four accumulators).
macro_rules! dot_tiles {
    ($op:literal, $c:expr, $a:expr, $b:expr) => {
        on_tiles!($op, $c, $a, $b, dot; (0, 4, 6), (1, 4, 7), (2, 5, 6), (3, 5, 7), (1, 4, 6))
    };
}

/// Zero tile `T` (0..=3, the accumulators).
///
/// # Safety
/// The tiles are configured ([`TileConfig::load`]).
#[inline(always)]
pub(crate) unsafe fn zero<const T: u8>() {
    // SAFETY: as the caller promises.
    unsafe { on_tiles!("tilezero", T; 0, 1, 2, 3) }
}

/// Load tile `T` (0..=7): its configured rows from `p`, `stride` bytes apart.
///
/// # Safety
/// The tiles are configured; each row's configured bytes at `p + r * stride` are readable.
#[inline(always)]
pub(crate) unsafe fn load<const T: u8>(p: *const u8, stride: usize) {
    // SAFETY: as the caller promises.
    unsafe { on_tiles!("tileloadd", T, p, stride, load; 0, 1, 2, 3, 4, 5, 6, 7) }
}

/// Store tile `T` (0..=3): its configured rows to `p`, `stride` bytes apart.
///
/// # Safety
/// The tiles are configured; each row's configured bytes at `p + r * stride` are writable and
/// no reference covers them.
#[inline(always)]
pub(crate) unsafe fn store<const T: u8>(p: *mut u8, stride: usize) {
    // SAFETY: as the caller promises.
    unsafe { on_tiles!("tilestored", T, p, stride, store; 0, 1, 2, 3) }
}

/// `C += A · B` with signed bytes in tile `A` (rows by 4-byte groups of K) and unsigned bytes
/// in tile `B` (K/4 rows of 4-byte groups per column) into the i32 tile `C` (`tdpbsud`).
///
/// # Safety
/// The tiles are configured with matching shapes.
#[inline(always)]
pub(crate) unsafe fn dot_signed_unsigned<const C: u8, const A: u8, const B: u8>() {
    // SAFETY: as the caller promises.
    unsafe { dot_tiles!("tdpbsud", C, A, B) }
}

/// As [`dot_signed_unsigned`] with signed bytes in both tiles (`tdpbssd`).
///
/// # Safety
/// The tiles are configured with matching shapes.
#[inline(always)]
pub(crate) unsafe fn dot_signed_signed<const C: u8, const A: u8, const B: u8>() {
    // SAFETY: as the caller promises.
    unsafe { dot_tiles!("tdpbssd", C, A, B) }
}

/// Int8 multiply-adds per second of this thread's tile unit: `rounds` of four independent
/// 16 x 16 x 64 `tdpbssd` products (the measurement behind the prompt limit of
/// `scripts/bench-vs-llamacpp.sh`). `None` without AMX-INT8.
pub(crate) fn peak_macs(rounds: usize) -> Option<f64> {
    if !usable() {
        return None;
    }
    let mut cfg = TileConfig::new();
    for t in 0..8 {
        cfg.set(t, 16, 64);
    }
    let operands = [1u8; 1024];
    let start = std::time::Instant::now();
    // SAFETY: usable(); every tile 16 rows of 64 bytes, loaded from 1 KiB.
    unsafe {
        cfg.load();
        zero::<0>();
        zero::<1>();
        zero::<2>();
        zero::<3>();
        load::<4>(operands.as_ptr(), 64);
        load::<5>(operands.as_ptr(), 64);
        load::<6>(operands.as_ptr(), 64);
        load::<7>(operands.as_ptr(), 64);
        for _ in 0..rounds {
            dot_signed_signed::<0, 4, 6>();
            dot_signed_signed::<1, 4, 7>();
            dot_signed_signed::<2, 5, 6>();
            dot_signed_signed::<3, 5, 7>();
        }
        release();
    }
    let secs = start.elapsed().as_secs_f64();
    Some((rounds * 4 * 16 * 16 * 64) as f64 / secs)
}

/// Nanoseconds per tile operation on this thread, for `cargo bench -p rgml-cpu`: a
/// `tileloadd` of 1 KiB from L1 (four tiles in turn, nothing using them), a `tdpbssd` (four
/// independent accumulators) and a `tilestored` of 1 KiB to L1, each over `rounds` rounds of
/// four. `None` without AMX-INT8.
pub(crate) fn op_nanos(rounds: usize) -> Option<[f64; 3]> {
    if !usable() {
        return None;
    }
    let mut cfg = TileConfig::new();
    for t in 0..8 {
        cfg.set(t, 16, 64);
    }
    let operands = [1u8; 4096];
    let mut out = [0u8; 4096];
    let per_op =
        |start: std::time::Instant| start.elapsed().as_secs_f64() * 1e9 / (4 * rounds) as f64;
    // SAFETY: usable(); every tile 16 rows of 64 bytes, loaded from and stored to 1 KiB pieces
    // of the 4 KiB arrays.
    unsafe {
        cfg.load();
        let start = std::time::Instant::now();
        for _ in 0..rounds {
            load::<4>(operands.as_ptr(), 64);
            load::<5>(operands.as_ptr().add(1024), 64);
            load::<6>(operands.as_ptr().add(2048), 64);
            load::<7>(operands.as_ptr().add(3072), 64);
        }
        let loads = per_op(start);
        let start = std::time::Instant::now();
        for _ in 0..rounds {
            dot_signed_signed::<0, 4, 6>();
            dot_signed_signed::<1, 4, 7>();
            dot_signed_signed::<2, 5, 6>();
            dot_signed_signed::<3, 5, 7>();
        }
        let products = per_op(start);
        let start = std::time::Instant::now();
        for _ in 0..rounds {
            store::<0>(out.as_mut_ptr(), 64);
            store::<1>(out.as_mut_ptr().add(1024), 64);
            store::<2>(out.as_mut_ptr().add(2048), 64);
            store::<3>(out.as_mut_ptr().add(3072), 64);
        }
        let stores = per_op(start);
        release();
        std::hint::black_box(&out);
        Some([loads, products, stores])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 16 x 64 signed by 64 x 16 unsigned and signed bytes, against the integer definition.
    #[test]
    fn tile_products_equal_the_integer_sums() {
        if !usable() {
            return;
        }
        let a: Vec<i8> = (0..1024).map(|i| ((i * 7 + 3) % 251) as u8 as i8).collect();
        let b: Vec<u8> = (0..1024).map(|i| ((i * 13 + 5) % 256) as u8).collect();
        let mut cfg = TileConfig::new();
        for t in [0, 1, 4, 6] {
            cfg.set(t, 16, 64);
        }
        let (mut su, mut ss) = (vec![0i32; 256], vec![0i32; 256]);
        // SAFETY: usable(); 16 rows of 64 bytes at each pointer, 64 bytes apart.
        unsafe {
            cfg.load();
            zero::<0>();
            zero::<1>();
            load::<4>(a.as_ptr().cast(), 64);
            load::<6>(b.as_ptr(), 64);
            dot_signed_unsigned::<0, 4, 6>();
            dot_signed_signed::<1, 4, 6>();
            store::<0>(su.as_mut_ptr().cast(), 64);
            store::<1>(ss.as_mut_ptr().cast(), 64);
            release();
        }
        for m in 0..16 {
            for n in 0..16 {
                let (mut want_su, mut want_ss) = (0i32, 0i32);
                for k in 0..64 {
                    let bv = b[(k / 4) * 64 + n * 4 + k % 4];
                    want_su += i32::from(a[m * 64 + k]) * i32::from(bv);
                    want_ss += i32::from(a[m * 64 + k]) * i32::from(bv as i8);
                }
                assert_eq!(su[m * 16 + n], want_su, "tdpbsud ({m}, {n})");
                assert_eq!(ss[m * 16 + n], want_ss, "tdpbssd ({m}, {n})");
            }
        }
    }
}
