"""What runs on a worker: one task's batches read, computed and written, and what they run on."""
