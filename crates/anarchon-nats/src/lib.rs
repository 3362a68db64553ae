//! anarchon's NATS backends (work in progress).
