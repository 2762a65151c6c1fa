"""A spec's source as one listing transform, whatever its kind.

A tree, an input list, a COCO file and a PCollection of rows are each a PTransform
(discover.ListTree, ListInputList, ListRows; coco.ListCoco) with one output shape:
``{LISTING: InputFile | DeadLetter, IGNORED: the Ignored kind of each entry left out on purpose}``.
ListSource picks the one the spec names, so that the job downstream never asks which it was.
"""

from __future__ import annotations

from collections.abc import Callable

import apache_beam as beam
from apache_beam.typehints.decorators import no_annotations  # expand's hints are mypy's: Beam reads PCollection[T] only

from beam_jobs.listing.coco import ListCoco
from beam_jobs.listing.discover import IGNORED, LISTING, ListInputList, ListRows, ListTree
from beam_jobs.spec import Source

__all__ = ["IGNORED", "LISTING", "ListSource"]


def _tree(source: Source) -> beam.PTransform:
    assert source.root is not None  # Source.kind says so
    return ListTree(source.root, allow_outside_root=source.allow_outside_root, with_ignored=True)


def _input_list(source: Source) -> beam.PTransform:
    assert source.input_list is not None  # Source.kind says so
    return ListInputList(source.input_list, allow_outside_root=source.allow_outside_root, with_ignored=True)


def _rows(source: Source) -> beam.PTransform:
    assert source.rows_root is not None  # Source.kind says so
    return ListRows(source.rows_root, allow_outside_root=source.allow_outside_root)


def _coco(source: Source) -> beam.PTransform:
    assert source.root is not None  # Source checks that COCO files come with their image root
    return ListCoco(
        list(source.coco_files),
        root=source.root,
        keep_empty=source.keep_unannotated,
        allow_outside_root=source.allow_outside_root,
        masks=source.coco_masks,
        with_ignored=True,
    )


# Source.kind -> the transform that lists it.
_LISTERS: dict[str, Callable[[Source], beam.PTransform]] = {
    "tree": _tree,
    "list": _input_list,
    "rows": _rows,
    "coco": _coco,
}


class ListSource(beam.PTransform):
    """The source's inputs: applied to a pipeline for a tree, a list or COCO files, to a
    PCollection of rows for rows."""

    def __init__(self, source: Source) -> None:
        super().__init__()
        self._source = source

    @no_annotations
    def expand(self, start: beam.pvalue.PBegin | beam.PCollection) -> dict[str, beam.PCollection]:
        """Applies the source kind's own listing transform."""
        listed = start | _LISTERS[self._source.kind](self._source)
        # {LISTING: InputFile | DeadLetter, IGNORED: Ignored kind}
        return {LISTING: listed[LISTING], IGNORED: listed[IGNORED]}
