"""Apache Beam job that converts raw image collections into deterministic, sharded TFRecords."""

__version__ = "0.1.0"
