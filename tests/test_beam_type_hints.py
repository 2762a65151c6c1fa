"""Beam's type hints on the job's tagged outputs: each names its tag, so that Beam keeps the tagged
values out of the main output's type. A bare ``TaggedOutput`` in a return type joins the main
output's type (from Beam 2.78 on, the stage after it then refuses the PCollection at build time)."""

from __future__ import annotations

import importlib
import inspect
import logging
import pkgutil
import typing

import apache_beam as beam
import pytest
from apache_beam.pvalue import TaggedOutput

import beam_jobs
from beam_jobs.listing import discover, roots
from beam_jobs.planning import append_joins
from beam_jobs.writing import convert_shards


@pytest.mark.parametrize(
    ("alias", "tag"),
    [
        (discover.IgnoredOutput, roots.IGNORED),
        (append_joins.PlanDeadLetterOutput, append_joins.PLAN_DEAD_LETTERS),
        (append_joins.GroupMembershipOutput, append_joins.GROUP_MEMBERSHIPS),
        (convert_shards.DeadLetterOutput, convert_shards.DEAD_LETTERS),
        (convert_shards.ContentKeyOutput, convert_shards.CONTENT_KEYS),
    ],
)
def test_each_tagged_output_type_names_the_tag_its_values_go_to(alias, tag):
    assert typing.get_origin(alias) is TaggedOutput
    literal, _ = typing.get_args(alias)
    assert typing.get_args(literal) == (tag,)


def _bare_tagged_outputs(hint) -> bool:
    if hint is TaggedOutput:
        return True
    return any(_bare_tagged_outputs(arg) for arg in typing.get_args(hint) if typing.get_origin(arg) is not TaggedOutput)


def _functions(module):
    for _, value in vars(module).items():
        if inspect.isfunction(value) and value.__module__ == module.__name__:
            yield value.__qualname__, value
        elif inspect.isclass(value) and value.__module__ == module.__name__:
            for name, member in vars(value).items():
                if isinstance(member, staticmethod):
                    member = member.__func__
                if inspect.isfunction(member):
                    yield f"{value.__qualname__}.{name}", member


def test_no_function_of_the_job_returns_a_bare_tagged_output():
    found = []
    for info in pkgutil.walk_packages(beam_jobs.__path__, "beam_jobs."):
        module = importlib.import_module(info.name)
        for name, function in _functions(module):
            try:
                hints = typing.get_type_hints(function)
            except Exception:  # a hint that names a type only a type checker imports
                continue
            if "return" in hints and _bare_tagged_outputs(hints["return"]):
                found.append(f"{module.__name__}.{name}")
    assert not found, found


def test_the_main_output_of_a_tagged_stage_keeps_its_own_type():
    with beam.Pipeline() as pipeline:
        letters = pipeline | beam.Create([]).with_output_types(convert_shards.DeadLetter)
        routed = letters | beam.FlatMap(discover._sort_entry, root="/", allow_outside_root=False).with_outputs(
            roots.IGNORED, main=roots.LISTING
        )
        main_type = routed[roots.LISTING].element_type
        assert TaggedOutput not in getattr(main_type, "union_types", ()), main_type


def _ptransforms():
    for info in pkgutil.walk_packages(beam_jobs.__path__, "beam_jobs."):
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            if inspect.isclass(value) and issubclass(value, beam.PTransform) and value.__module__ == module.__name__:
                if "expand" in vars(value):
                    yield f"{module.__name__}.{name}", value


def test_beam_reads_every_transforms_hints_without_a_warning(caplog):
    """A hint Beam cannot use (a dict of outputs, a PBegin or a PCollection) makes it log one
    warning line per transform on the user's console, from Beam 2.78 on."""
    from apache_beam.typehints.decorators import IOTypeHints

    noisy = []
    for name, transform in _ptransforms():
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            hints = IOTypeHints.from_callable(transform.expand)
            if hints is not None:
                hints.strip_pcoll()
        if caplog.records:
            noisy.append(f"{name}: {caplog.records[0].getMessage()[:80]}")
    assert not noisy, noisy
