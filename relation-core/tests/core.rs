//! Tests of the references against each other, against finite differences, and against the
//! invariants of the spec. One test binary for the whole crate (CI builds are slow).

mod common;

mod docs;
mod errors;
mod givens_rope;
mod gradients;
mod linear;
mod relation;
