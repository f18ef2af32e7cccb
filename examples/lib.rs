//! Shared helpers for the examples (none yet).
