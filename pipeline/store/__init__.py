"""Zarr on disk: the arrays the pipeline reads and how zarr stores them (paths, chunk files and keys,
missing chunks, sparse batches, the codec pipeline arrays are opened with), and the one module that
reaches into zarr's private API (:mod:`._zarr`)."""
