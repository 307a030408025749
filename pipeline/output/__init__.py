"""A run's output group and what makes resume safe: its provenance and status, the completion record
of each chunk with the digest of the input it was computed from, and the lock that keeps one writer."""
