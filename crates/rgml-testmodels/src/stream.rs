//! Writing a big file's tensor data without holding it. rgml-gguf's writer lays out the
//! header (metadata, tensor infos, padding); the data is cut into pieces of at most
//! [`PIECE_BYTES`] that worker threads make and write straight to their place in the file
//! (positional writes at the offsets GGUF's layout gives: each tensor at the next multiple of
//! the alignment). This module owns that layout arithmetic, the threads and the `OUT.part`
//! file that becomes `OUT` only when complete; what a piece holds is the caller's (a function
//! of the piece alone, so the bytes do not depend on the thread count or the order pieces are
//! made in).
//!
//! Why not rgml-gguf's [`rgml_gguf::TensorStream`]: it takes the data in order through one
//! writer, so one thread copies every byte into the page cache while the others wait; with
//! positional writes each worker copies its own pieces, and memory stays at one piece per
//! worker. The test `positional_writes_give_the_stream_s_bytes` checks that both lay out the
//! same bytes.

use crate::error::{Error, Result};
use rgml_gguf::{GgufWriter, TensorDecl};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;

/// The most bytes of one piece.
pub const PIECE_BYTES: usize = 4 << 20;

/// A run of one tensor's bytes, made in one go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Piece {
    /// The tensor's index in the declarations.
    pub tensor: usize,
    /// The piece's index within the tensor.
    pub index: u64,
    /// Bytes.
    pub len: usize,
}

/// Cut a tensor of `bytes` bytes whose unit (a block) is `unit` bytes into pieces of whole
/// units, at most [`PIECE_BYTES`] each (at least one unit).
pub fn pieces(tensor: usize, bytes: usize, unit: usize) -> impl Iterator<Item = Piece> {
    let step = (PIECE_BYTES / unit.max(1)).max(1) * unit.max(1);
    (0..bytes.div_ceil(step)).map(move |i| Piece {
        tensor,
        index: i as u64,
        len: step.min(bytes - i * step),
    })
}

/// `OUT.part`, beside `OUT`.
pub fn part_path(out: &Path) -> PathBuf {
    let mut name = out.file_name().unwrap_or_default().to_os_string();
    name.push(".part");
    out.with_file_name(name)
}

/// Write `header` and the data of the tensors `decls` to `out`: under `OUT.part`, renamed to
/// `out` once complete (removed on failure). `pieces` must cover each tensor's bytes, in
/// order within a tensor; `fill` makes a piece's bytes (`out` has the piece's length) on one
/// of `threads` workers.
pub fn write_file(
    out: &Path,
    header: &GgufWriter,
    decls: &[TensorDecl],
    pieces: &[Piece],
    threads: usize,
    fill: &(dyn Fn(&Piece, &mut [u8]) + Sync),
) -> Result<()> {
    let (head, offsets, total) = layout(header, decls, pieces)?;
    let part = part_path(out);
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| Error::Io { path, source }
    };
    let file = File::create(&part).map_err(io(&part))?;
    let written = (|| {
        // The padding between tensors is never written: the file's length makes it zeros.
        file.set_len(total).map_err(io(&part))?;
        write_at(&file, &head, 0).map_err(io(&part))?;
        write_pieces(&file, &part, pieces, &offsets, threads, fill)
    })();
    drop(file);
    if let Err(e) = written {
        // The partial file is useless; failing to delete it changes nothing for the user.
        let _ = std::fs::remove_file(&part);
        return Err(e);
    }
    std::fs::rename(&part, out).map_err(io(out))
}

/// The header's bytes (up to the data, padding included), the file offset of every piece,
/// and the file's length.
fn layout(
    header: &GgufWriter,
    decls: &[TensorDecl],
    pieces: &[Piece],
) -> Result<(Vec<u8>, Vec<u64>, u64)> {
    let mut head = Vec::new();
    // The stream writes the header and its padding at once; the data is written here instead,
    // so it is dropped unfinished.
    drop(header.stream_to(&mut head, decls)?);
    let alignment = header.alignment()? as u64;
    let mut size = vec![0u64; decls.len()];
    let mut offsets = Vec::with_capacity(pieces.len());
    for p in pieces {
        let at = size.get_mut(p.tensor).ok_or_else(|| {
            Error::Layout(format!("a piece of tensor {} of {}", p.tensor, decls.len()))
        })?;
        offsets.push(*at);
        *at += p.len as u64;
    }
    let mut start = head.len() as u64;
    let mut tensor_start = Vec::with_capacity(decls.len());
    for (d, &bytes) in decls.iter().zip(&size) {
        let rows: usize = d.ne.iter().skip(1).product();
        let want = d.dtype.row_bytes(d.ne.first().copied().unwrap_or(1))? * rows;
        if bytes != want as u64 {
            return Err(Error::Layout(format!(
                "tensor '{}': pieces of {bytes} bytes for {want}",
                d.name
            )));
        }
        tensor_start.push(start);
        start += bytes.div_ceil(alignment) * alignment;
    }
    for (offset, p) in offsets.iter_mut().zip(pieces) {
        *offset += tensor_start[p.tensor];
    }
    Ok((head, offsets, start))
}

/// Make and write `pieces` (at `offsets`) on `threads` workers, taking pieces in order.
fn write_pieces(
    file: &File,
    path: &Path,
    pieces: &[Piece],
    offsets: &[u64],
    threads: usize,
    fill: &(dyn Fn(&Piece, &mut [u8]) + Sync),
) -> Result<()> {
    let next = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    let first_error = Mutex::new(None);
    let panicked = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads.clamp(1, pieces.len().max(1)))
            .map(|_| {
                scope.spawn(|| {
                    let mut buf = Vec::new();
                    while !stop.load(Ordering::Relaxed) {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let (Some(p), Some(&at)) = (pieces.get(i), offsets.get(i)) else {
                            return;
                        };
                        buf.resize(p.len, 0);
                        fill(p, &mut buf);
                        if let Err(source) = write_at(file, &buf, at) {
                            stop.store(true, Ordering::Relaxed);
                            let mut e = first_error.lock().unwrap_or_else(|e| e.into_inner());
                            e.get_or_insert(Error::Io {
                                path: path.to_path_buf(),
                                source,
                            });
                        }
                    }
                })
            })
            .collect();
        // Every handle is joined (not `any`, which would stop at the first panic).
        let joined: Vec<bool> = workers.into_iter().map(|w| w.join().is_err()).collect();
        joined.contains(&true)
    });
    if panicked {
        return Err(Error::WorkerPanicked);
    }
    match first_error.into_inner().unwrap_or_else(|e| e.into_inner()) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Write all of `buf` at `offset` of `file` (the file's cursor is not used).
#[cfg(unix)]
fn write_at(file: &File, buf: &[u8], offset: u64) -> std::io::Result<()> {
    std::os::unix::fs::FileExt::write_all_at(file, buf, offset)
}

/// Write all of `buf` at `offset` of `file`.
#[cfg(windows)]
fn write_at(file: &File, mut buf: &[u8], mut offset: u64) -> std::io::Result<()> {
    use std::os::windows::fs::FileExt;
    while !buf.is_empty() {
        match file.seek_write(buf, offset) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => {
                buf = &buf[n..];
                offset += n as u64;
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rgml::DType;
    use rgml_gguf::{GgufFile, Value};

    #[test]
    fn pieces_cover_a_tensor_in_whole_units() {
        let step = PIECE_BYTES / 18 * 18;
        let p: Vec<Piece> = pieces(3, 2 * step + 5 * 18, 18).collect();
        assert!(p
            .iter()
            .all(|x| x.tensor == 3 && x.len % 18 == 0 && x.len <= step));
        assert_eq!(
            p.iter().map(|x| x.len).collect::<Vec<_>>(),
            [step, step, 90]
        );
        assert_eq!(p.iter().map(|x| x.index).collect::<Vec<_>>(), [0, 1, 2]);
        assert_eq!(pieces(0, 4, 4).count(), 1);
        assert_eq!(pieces(0, 3 * PIECE_BYTES, 4).count(), 3);
    }

    /// Tensors of F32 (`a` elements, several pieces), Q8_0 (one block: padding after it)
    /// and F32 (`b` elements); piece bytes are `tensor * 100 + piece index`.
    fn decls(a: usize, b: usize) -> (Vec<TensorDecl>, Vec<Piece>) {
        let decl = |name: &str, dtype, n| TensorDecl {
            name: name.into(),
            dtype,
            ne: vec![n],
        };
        let d = vec![
            decl("a", DType::F32, a),
            decl("q", DType::Q8_0, 32),
            decl("b", DType::F32, b),
        ];
        let p = pieces(0, 4 * a, 4)
            .chain(pieces(1, 34, 34))
            .chain(pieces(2, 4 * b, 4))
            .collect();
        (d, p)
    }

    fn header() -> GgufWriter {
        let mut w = GgufWriter::new();
        w.add_metadata("general.name", Value::String("odd length".into()));
        w
    }

    fn fill(p: &Piece, out: &mut [u8]) {
        out.fill((p.tensor * 100) as u8 + p.index as u8);
    }

    fn write(dir: &Path, name: &str, threads: usize, a: usize, b: usize) -> Result<PathBuf> {
        let (d, p) = decls(a, b);
        let out = dir.join(name);
        write_file(&out, &header(), &d, &p, threads, &fill)?;
        Ok(out)
    }

    fn scratch(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("rgml-testmodels-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn positional_writes_give_the_stream_s_bytes() {
        let dir = scratch("order");
        let (a, b) = (3 * PIECE_BYTES / 4 + 7, 9);
        let one = std::fs::read(write(&dir, "one.gguf", 1, a, b).unwrap()).unwrap();
        let four = std::fs::read(write(&dir, "four.gguf", 4, a, b).unwrap()).unwrap();
        assert_eq!(one, four);
        // The same data through rgml-gguf's sequential stream.
        let (d, p) = decls(a, b);
        let mut stream = header().stream_to(Vec::new(), &d).unwrap();
        for piece in &p {
            let mut buf = vec![0; piece.len];
            fill(piece, &mut buf);
            stream.write_data(&buf).unwrap();
        }
        assert!(
            stream.finish().unwrap() == one,
            "the bytes differ from TensorStream's"
        );
        let f = GgufFile::from_bytes(one).unwrap();
        let data = f.tensor_data(f.tensor("a").unwrap());
        assert!(data[PIECE_BYTES..2 * PIECE_BYTES].iter().all(|&x| x == 1));
        assert!(f
            .tensor_data(f.tensor("b").unwrap())
            .iter()
            .all(|&x| x == 200));
        assert!(!part_path(&dir.join("one.gguf")).exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn pieces_that_do_not_cover_a_tensor_are_refused() {
        let (d, mut p) = decls(8, 8);
        p.pop();
        let err = layout(&header(), &d, &p).unwrap_err();
        assert!(err.to_string().contains("tensor 'b'"), "{err}");
    }

    #[test]
    fn an_unwritable_output_is_an_error_naming_the_file() {
        let dir = scratch("unwritable");
        let err = write(&dir.join("no/such/dir"), "x.gguf", 2, 8, 8).unwrap_err();
        assert!(matches!(err, Error::Io { .. }), "{err}");
        assert!(err.to_string().contains("x.gguf.part"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
