"""Step 1, listing: what the inputs are. A class-per-folder tree or a CSV/JSONL list (or a user's
rows) become InputFiles and dead letters, by one policy for symlinks, hidden and special files
(policy.py) and one naming policy for labels and splits (names.py)."""
