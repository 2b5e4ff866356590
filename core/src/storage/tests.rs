//! Decision tests of the storage protocol on an in-memory file system.
