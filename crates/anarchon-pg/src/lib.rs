//! anarchon's pg lease backend (work in progress).
