//! Helpers shared by the end-to-end tests: locating built binaries, free ports, processes.
