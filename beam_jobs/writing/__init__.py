"""Step 4, writing and committing: a shard per unit of work into the run's own folder
(convert_shards.py, example_conversion.py, shard_sidecar.py, tfrecord_framing.py), then one atomic
commit of a new version (finalize.py and its steps, commit.py, append.py), under a run lock, with
the run folders' bookkeeping."""
