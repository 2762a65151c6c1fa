"""Where the examples come from: the dataset's files, before any record is parsed. In the order
they run: schemes.py refuses a storage scheme TensorFlow cannot open, manifest.py reads and
validates dataset_info.json, files.py checks the shards it lists and splits them into the pieces
each input pipeline reads, and records.py reads a shard's serialized records (naming a bad one by
shard and offset); classes.py answers per-class counts from the manifest alone."""
