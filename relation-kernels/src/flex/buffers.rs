//! Output buffers of the Flex kernels: zero-filled ([`output`]) for those accumulated into,
//! uninitialised ([`Uninit`], [`init_rows`], [`zero_rows`]) for those a kernel writes whole. While
//! outputs are poisoned ([`crate::poison`], tests) every new buffer is NaN-filled first, so an
//! element a kernel forgets to write fails the tests.

/// An output buffer of `len` f32 handed out uninitialised, for the kernels that write every
/// element themselves: the element-wise kernels (the cross-entropy's `[B·T, V]` gradient,
/// SwiGLU, RoPE, RMSNorm) write straight into [`Uninit::room`], and FlashRelation's tasks
/// initialise their own rows ([`init_rows`]) right before writing them, in cache. A fill of the
/// whole buffer first ([`output`]) would be one more pass over memory, a visible share of a
/// training step. While outputs are poisoned (tests) the room is
/// NaN-filled first, as [`output`]'s buffers are, so an element a kernel does not write fails
/// the tests.
pub(crate) struct Uninit(Vec<f32>, usize);

impl Uninit {
    /// Room for `len` values (NaN while outputs are poisoned).
    pub(crate) fn new(len: usize) -> Self {
        let mut buf = Uninit(Vec::with_capacity(len), len);
        if crate::poison::poisoning() {
            fill(buf.room(), f32::NAN);
        }
        buf
    }

    /// The `len` values of room, uninitialised.
    pub(crate) fn room(&mut self) -> &mut [std::mem::MaybeUninit<f32>] {
        &mut self.0.spare_capacity_mut()[..self.1]
    }

    /// The buffer, every value initialised.
    ///
    /// # Safety
    /// Every value of [`Uninit::room`] must have been written.
    #[allow(unsafe_code)]
    pub(crate) unsafe fn assume_init(mut self) -> Vec<f32> {
        // SAFETY: the capacity is at least `len`, and all `len` values were written (the
        // contract).
        unsafe { self.0.set_len(self.1) };
        self.0
    }
}

/// Initialises a task's output rows (zeros, or NaN while outputs are poisoned, so that the
/// tests still see an element the kernel does not write) and returns them as f32 rows. Rows the
/// kernel writes whole need no initialisation (it writes them through `MaybeUninit::write`), and
/// accumulators start from [`zero_rows`].
pub(crate) fn init_rows<'b>(
    rows: &mut Vec<&'b mut [std::mem::MaybeUninit<f32>]>,
) -> Vec<&'b mut [f32]> {
    rows_filled(rows, fill_value())
}

/// A task's accumulator rows, zeroed whether or not outputs are poisoned: the kernel's sums
/// start from them (so there is no unwritten element for the poison to reveal), and the task
/// zeroes them here, in cache, once.
pub(crate) fn zero_rows<'b>(
    rows: &mut Vec<&'b mut [std::mem::MaybeUninit<f32>]>,
) -> Vec<&'b mut [f32]> {
    rows_filled(rows, 0.0)
}

/// `rows`, every element set to `value`, as f32 rows.
fn rows_filled<'b>(
    rows: &mut Vec<&'b mut [std::mem::MaybeUninit<f32>]>,
    value: f32,
) -> Vec<&'b mut [f32]> {
    rows.drain(..)
        .map(|row| {
            for x in row.iter_mut() {
                x.write(value);
            }
            let (ptr, len) = (row.as_mut_ptr().cast::<f32>(), row.len());
            // SAFETY: every element of `row` was just written; `MaybeUninit<f32>` has the
            // layout of `f32`, and the new borrow takes over `row`'s.
            #[allow(unsafe_code)]
            unsafe {
                std::slice::from_raw_parts_mut(ptr, len)
            }
        })
        .collect()
}

/// Outputs at least this long (64 K f32, 256 KiB) are filled on the thread pool ([`fill`]).
const PAR_FILL_MIN: usize = 1 << 16;

/// Elements per task of [`fill`]'s parallel fill (64 KiB of f32).
const FILL_CHUNK: usize = 1 << 14;

/// An output buffer of `len` f32: zeros, or NaN while outputs are poisoned (tests).
///
/// The fill is a pass over memory the kernel then writes again: the kernels that write every
/// element themselves take an [`Uninit`] instead; this is for the buffers that are accumulated
/// into or written in scattered blocks (the heads' transposes, Linear Relation's gradients).
pub(crate) fn output(len: usize) -> Vec<f32> {
    let mut y = Vec::with_capacity(len);
    fill(&mut y.spare_capacity_mut()[..len], fill_value());
    // SAFETY: `fill` wrote each of the first `len` elements of the capacity.
    #[allow(unsafe_code)]
    unsafe {
        y.set_len(len);
    }
    y
}

/// What new outputs hold before a kernel writes them: 0, or NaN while outputs are poisoned.
fn fill_value() -> f32 {
    if crate::poison::poisoning() {
        f32::NAN
    } else {
        0.0
    }
}

/// Writes `value` to every element of `room`: on the thread pool from [`PAR_FILL_MIN`]
/// elements on (done on the calling thread, large fills ran while the other workers waited).
fn fill(room: &mut [std::mem::MaybeUninit<f32>], value: f32) {
    use rayon::prelude::*;
    if room.len() < PAR_FILL_MIN {
        room.iter_mut().for_each(|x| {
            x.write(value);
        });
        return;
    }
    room.par_chunks_mut(FILL_CHUNK).for_each(|chunk| {
        for x in chunk {
            x.write(value);
        }
    });
}
