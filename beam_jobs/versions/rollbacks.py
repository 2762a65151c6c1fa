"""Rolling back: a new version whose content is an older one's, under the run lock."""

from __future__ import annotations

from beam_jobs.errors import JobError
from beam_jobs.planning.rules import label_id_changes
from beam_jobs.versions.manifests import _missing_files, _shard_sizes
from beam_jobs.versions.reading import _existing, _no_dataset, load_version
from beam_jobs.writing.commit import (
    VERSION_KEYS,
    commit_version,
    read_current,
)
from beam_jobs.writing.run_lock import acquire_output_lock, release_output_lock


def rollback(output_dir: str, version: int) -> dict:
    """Commits a new version whose content is version ``version``'s (the same shard files, nothing
    copied), change kind ``rollback``. Refuses when that version's shards were collected.

    Its label ids are that version's: where they differ from the current version's (a version
    before a --relabel sorted, or one without a label added since), the change's ``label_ids``
    says how, so that a model trained on the current version is not fed other ids unwarned."""
    lock = acquire_output_lock(output_dir)
    try:
        current = read_current(output_dir)
        if current.manifest is None:
            raise _no_dataset(output_dir)
        if version == current.version:
            raise JobError(f"version {version} is already the current version of {output_dir}; nothing to roll back")
        target = load_version(output_dir, version)
        missing = _missing_files(target, _existing(output_dir))
        shards = [name for name in missing if name in _shard_sizes(target)]
        if shards:
            raise JobError(
                f"cannot roll back {output_dir} to version {version}: {len(shards)} of its "
                f"{len(_shard_sizes(target))} shard files are gone (collected by gc?), e.g. {shards[0]}; "
                "nothing was committed"
            )
        if missing:  # Its shards are there (a later version uses them), its dead letters are not.
            raise JobError(
                f"cannot roll back {output_dir} to version {version}: its dead letters ({missing[0]}) are gone "
                "(collected by gc?), and a version without them fails verify; nothing was committed"
            )
        content = {key: value for key, value in target.items() if key not in VERSION_KEYS}
        change = {"kind": "rollback", "run": None, "rolled_back_to": version}
        differences = label_id_changes(current.manifest.get("label_names", []), target.get("label_names", []))
        if differences:
            change["label_ids"] = (
                f"label ids differ: version {version}'s are not version {current.version}'s: {', '.join(differences)}"
            )
        return commit_version(output_dir, content, expected=current, change=change)
    finally:
        release_output_lock(lock)
