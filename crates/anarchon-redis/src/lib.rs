//! anarchon's Redis backend (work in progress).
