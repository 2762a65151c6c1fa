"""Step 4, writing and committing: a shard per unit of work into the run's own folder
(convert_shards.py, tfrecord_framing.py), then one atomic commit of a new version
(finalize.py, commit.py, append.py), under a run lock, with the run folders' bookkeeping."""
