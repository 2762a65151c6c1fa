"""ConvertImages' keyword form: the command line's settings under their Python names, as a spec.

``ConvertImages(rows_root=..., output_dir=..., image_config=...)`` predates ConversionSpec; it is
kept for pipelines written against it, and builds the same spec (and, when any part of the run's
context is given, the RunContext) that ``ConvertImages(spec)`` takes.
"""

from __future__ import annotations

from beam_jobs.config import ImageConfig
from beam_jobs.planning.group_rules import DEFAULT_NEAR_COPY_BITS
from beam_jobs.planning.rules import DEFAULT_SPLIT_RULE, DEFAULT_TARGET_SHARD_MB
from beam_jobs.run_context import RunContext
from beam_jobs.spec import ConversionSpec, Limits, RunMode, ShardSpec, Source, SplitSpec
from beam_jobs.writing.commit import Current, read_current
from beam_jobs.writing.convert_shards import CONVERT_THREADS
from beam_jobs.writing.run_folders import new_run_name

__all__ = ["spec_of_keywords"]


def spec_of_keywords(
    *,
    output_dir: str,
    input_root: str | None = None,
    input_list: str | None = None,
    rows_root: str | None = None,
    image_config: ImageConfig | None = None,
    split_fractions: dict[str, float] | None = None,
    num_shards: int | None = None,
    target_shard_bytes: int = DEFAULT_TARGET_SHARD_MB * 2**20,
    max_bad_fraction: float = 0.01,
    dedup: str = "path",
    resume: bool = False,
    allow_outside_root: bool = False,
    tree_layout: str = "auto",
    plan_only: bool = False,
    run_id: str | None = None,
    split_rule: str = DEFAULT_SPLIT_RULE,
    split_groups: str = "none",
    near_copy_bits: int = DEFAULT_NEAR_COPY_BITS,
    group_pattern: str | None = None,
    expected: Current | None = None,
    change_kind: str = "create",
    keep_versions: int = 2,
    changed_sources: str = "refuse",
    convert_threads: int = CONVERT_THREADS,
    coco_files: list[tuple[str | None, str]] | None = None,
    keep_unannotated: bool = True,
    coco_masks: bool = False,
    relabel: str = "keep",
) -> tuple[ConversionSpec, RunContext | None]:
    """The spec (and, when any of its parts is given, the run's context) that ConvertImages'
    keyword form stands for: the command line's settings under their Python names."""
    if sum(source is not None for source in (input_root, input_list, rows_root)) != 1:
        raise ValueError(
            "ConvertImages takes exactly one of input_root (a tree), input_list (a CSV/JSONL "
            "file) and rows_root (applied to a PCollection of rows)"
        )
    spec = ConversionSpec(
        source=Source(
            root=input_root,
            input_list=input_list,
            rows_root=rows_root,  # Source resolves every path it is given
            coco_files=tuple(coco_files or ()),
            keep_unannotated=keep_unannotated,
            coco_masks=coco_masks,
            tree_layout=tree_layout,
            allow_outside_root=allow_outside_root,
            dedup=dedup,
        ),
        output_dir=output_dir,
        image=image_config if image_config is not None else ImageConfig(),
        splits=SplitSpec(
            fractions=split_fractions,
            rule=split_rule,
            groups=split_groups,
            near_copy_bits=near_copy_bits,
            group_pattern=group_pattern,
        ),
        shards=ShardSpec(num_shards=num_shards, target_shard_mb=target_shard_bytes / 2**20),
        limits=Limits(max_bad_fraction=max_bad_fraction),
        mode=RunMode(
            # The keyword form commits a version on every use, as it always has: over a dataset
            # already there, that is an overwrite.
            overwrite=change_kind != "append",
            append=change_kind == "append",
            resume=resume,
            plan_only=plan_only,
            changed_sources=changed_sources,
            relabel=relabel,
            keep_versions=keep_versions,
        ),
    )
    if run_id is None and expected is None and change_kind == "create" and convert_threads == CONVERT_THREADS:
        return spec, None  # the run's context comes from the output folder when the transform is made
    if not plan_only:
        run_id = run_id if run_id is not None else new_run_name()
        expected = expected if expected is not None else read_current(output_dir)
    if change_kind == "create" and expected is not None and expected.manifest is not None:
        change_kind = "overwrite"
    return spec, RunContext(run_id=run_id, expected=expected, change_kind=change_kind, convert_threads=convert_threads)
