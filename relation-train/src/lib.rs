//! # relation-train
//!
//! The training, evaluation and sampling command line (`relation train | eval | generate`) for
//! `relation-model`'s language models. Not written yet: this crate holds its place in the
//! workspace layout. Until it lands, the README's main job is the `forward_backward` example.
