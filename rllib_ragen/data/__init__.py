"""Trajectory data: the Arrow schema, episodes <-> rows, Parquet I/O with Ray Data, solver demonstrations."""
