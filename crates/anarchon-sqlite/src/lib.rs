//! anarchon's sqlite lease backend (work in progress).
