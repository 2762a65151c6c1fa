"""Step 2, planning: which split and which shard each input goes to. rules.py holds the pure
rules (splits, dedup, shard counts and balance); transforms.py applies them in Beam, reading no
image."""
