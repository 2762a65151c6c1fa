"""--append's joins: the listed inputs against what the version appended to holds.

An input already held (same identity, bytes, label, annotations and split) is not converted
again; one that changed or went missing is reported by identity; a new input with bytes the
version holds under the same label is the same example twice. Each rule is a pure function of a
CoGroupByKey's group, but for reading a source's state or digest.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import replace
from typing import Final, Literal

import apache_beam as beam
from apache_beam.pvalue import TaggedOutput

from beam_jobs.errors import Reason, Stage
from beam_jobs.records import DeadLetter, InputFile, annotation_digest, content_label

__all__ = [
    "PLAN_CHANGES",
    "PLAN_DEAD_LETTERS",
    "PlanDeadLetterOutput",
    "SourceChangesFn",
    "GROUP_MEMBERSHIPS",
    "GroupMembershipOutput",
    "compare_with_held",
    "held_copy",
    "held_member",
    "with_digest",
]

PLAN_DEAD_LETTERS: Final = "plan_dead_letters"
# The type of a plan dead letter, for Beam's type hints: a bare TaggedOutput in a function's return
# type would join the main output's type, and the stages after it would refuse it.
PlanDeadLetterOutput = TaggedOutput[Literal["plan_dead_letters"], DeadLetter]
# --append: ("held" | "changed" | "removed", identity) for each input the current version holds:
# as it was converted, or not.
PLAN_CHANGES = "plan_changes"
# (identity, the listing's user group) of a held input whose row names another group than the
# one it was converted in: kept (--changed_sources keep), it joins the group its row names now.
HELD_REGROUPED = "held_regrouped"
# (user group, name): an input kept (or held) is also a member of the group of a copy of it that
# was dropped (group_rules.copy_memberships), so the copy's group still shares its split.
GROUP_MEMBERSHIPS: Final = "group_memberships"
GroupMembershipOutput = TaggedOutput[Literal["group_memberships"], tuple[str, str]]


def compare_with_held(
    group: tuple[str, Mapping[str, Iterable]],
    *,
    state_of: Callable[[InputFile], list],
    digests_of: Callable[[InputFile], list] | None = None,
) -> Iterable:
    """(identity, {"listed": [InputFile], "held": [record]}) -> the new inputs (main output) and
    the changes (PLAN_CHANGES): --append converts only what the current version does not hold.

    The identity is the input's path relative to its source's root (InputFile.filename), so a
    folder moved, copied or remounted elsewhere is the same inputs. An input held with the label,
    annotations and split its shard's sidecar recorded, and with the same bytes, is skipped; one
    that differs in any is "changed", one held but no longer listed "removed": both are reported
    by identity, never silently kept or dropped (the caller decides). ``state_of`` gives a listed
    input's [size, time] (reading.source_state), a hint: when it is the recorded one the bytes
    are taken as unchanged, else ``digests_of`` (reading.source_digests) hashes the source and
    only other bytes are a change. Pure but for ``state_of`` and ``digests_of``.
    """
    name, sides = group
    listed, held = list(sides["listed"]), list(sides["held"])
    if not held:
        yield from listed
        return
    if not listed:
        yield beam.pvalue.TaggedOutput(PLAN_CHANGES, ("removed", name))
        return
    if any(_differs(f, held[0], state_of, digests_of) for f in listed):
        yield beam.pvalue.TaggedOutput(PLAN_CHANGES, ("changed", name))
        if listed[0].user_group != held[0].get("user_group"):
            yield beam.pvalue.TaggedOutput(HELD_REGROUPED, (name, listed[0].user_group))
    else:
        yield beam.pvalue.TaggedOutput(PLAN_CHANGES, ("held", name))


def _differs(
    listed: InputFile, held: dict, state_of: Callable[[InputFile], list], digests_of: Callable[[InputFile], list] | None
) -> bool:
    """Whether a listed input is not what the version holds of it: other bytes (its mask's
    included), another label, other annotations (boxes, labels, mask path), another user group,
    or another split where the listing names one (a split the plan would assign is the one it was
    assigned: old inputs never move). Bytes are read only when the size or time differ from those recorded, and
    compared only where the sidecar recorded them (an earlier release's dead letters did not)."""
    if listed.label != held["label"] or annotation_digest(listed) != held.get("annotations"):
        return True
    if listed.split is not None and listed.split != held["split"]:
        return True
    if listed.user_group != held.get("user_group"):
        return True  # a row moved to another group: its group's split is not its own any more
    if list(state_of(listed)) == list(held["state"]):
        return False
    recorded = held.get("digests")
    return recorded is None or digests_of is None or list(digests_of(listed)) != list(recorded)


def held_copy(
    group: tuple[str, Mapping[str, Iterable]], *, version: int, dedup: str
) -> Iterator[InputFile | PlanDeadLetterOutput | GroupMembershipOutput]:
    """(sha256, {"new": [InputFile], "held": [(identity, content label)]}) -> the new inputs that
    are not bytes the version holds already (main output), and a dead letter for each that is
    (PLAN_DEAD_LETTERS), with its user group's membership for the held copy (GROUP_MEMBERSHIPS).

    A new input with the bytes and the label of an example the version holds would be the same
    example twice: it is ``duplicate_content``, naming the held one. Under another label it is
    kept, and the run's content duplicates report the two (one image taught two labels, as a
    fresh run reports it), unless ``dedup`` is "content", where such copies are
    ``conflicting_labels`` as in a fresh run (the held example stays: an append never changes it).
    """
    sha256, sides = group
    new, held = list(sides["new"]), sorted(sides["held"])
    if not held:
        yield from new
        return
    for f in new:
        same = [identity for identity, label in held if label == content_label(f)]
        if f.user_group and (same or dedup == "content"):
            # Dropped, but its group is in the dataset: the held copy's split is that group's.
            held_name = same[0] if same else held[0][0]
            yield GroupMembershipOutput(GROUP_MEMBERSHIPS, (f.user_group, held_name))
        if same:
            detail = f"same bytes as {same[0]!r}, held by version {version} under the same label"
            yield PlanDeadLetterOutput(
                PLAN_DEAD_LETTERS, DeadLetter(f.uri, Stage.LIST, Reason.DUPLICATE_CONTENT, detail)
            )
        elif dedup == "content":
            labels = sorted({label for _, label in held} | {content_label(f)})
            detail = (
                f"the same bytes (sha256 {sha256[:16]}...) are labelled {labels!r}: {f.filename!r} and "
                f"{held[0][0]!r}, held by version {version}"
            )
            yield PlanDeadLetterOutput(
                PLAN_DEAD_LETTERS, DeadLetter(f.uri, Stage.LIST, Reason.CONFLICTING_LABELS, detail)
            )
        else:
            yield f


def held_member(held: tuple[str, dict], regrouped: Mapping[str, str | None] | None = None) -> list[InputFile]:
    """An example the version holds, as the InputFile its split groups know (name, split, label,
    perceptual signature, user group): --append groups the new inputs with it, so that a new
    near-copy or group member takes its split. A held example whose row now names another group
    (kept by --changed_sources keep; HELD_REGROUPED) is in that group: its example keeps its
    split, and the group's new members take it, where the recorded group would let them land in
    another split than a member of their group. One with neither signature nor group is a member
    too: a new copy of it dropped as held (held_copy) makes it a member of the copy's group. Pure."""
    name, record = held
    if regrouped and name in regrouped:
        record = {**record, "user_group": regrouped[name]}
    member = InputFile(
        filename=name,
        uri=record["uri"],
        label=record["label"],
        split=record["split"],
        phash=record.get("phash"),
        user_group=record.get("user_group"),
    )
    return [member]


def with_digest(f: InputFile, *, digests_of: Callable[[InputFile], list]) -> InputFile:
    """A new input with the sha256 of its source (already known under --dedup content)."""
    if f.content_sha256 is not None:
        return f
    return replace(f, content_sha256=digests_of(f)[0])


class SourceChangesFn(beam.CombineFn):
    """("held" | "changed" | "removed", uri) -> {"held": n, "changed": n, "removed": n, and the
    first few uris of each change, sorted}: what --append reports, in one small element."""

    SHOWN = 10

    def create_accumulator(self) -> dict:
        """No input seen yet: nothing held, no change found."""
        return {"held": 0, "changed": [0, []], "removed": [0, []]}

    def add_input(self, accumulator: dict, element: tuple[str, str]) -> dict:
        """Counts one held input or one change, keeping only the first few changed uris in sorted order."""
        kind, uri = element
        if kind == "held":
            accumulator["held"] += 1
        else:
            count, shown = accumulator[kind]
            accumulator[kind] = [count + 1, sorted([*shown, uri])[: self.SHOWN]]
        return accumulator

    def merge_accumulators(self, accumulators: Iterable[dict]) -> dict:
        """Adds up the counts of several workers, and keeps the first few uris of each change of them all."""
        merged = self.create_accumulator()
        for accumulator in accumulators:
            merged["held"] += accumulator["held"]
            for kind in ("changed", "removed"):
                merged[kind] = [
                    merged[kind][0] + accumulator[kind][0],
                    sorted([*merged[kind][1], *accumulator[kind][1]])[: self.SHOWN],
                ]
        return merged

    def extract_output(self, accumulator: dict) -> dict:
        """The counts and the uris shown as flat keys, the shape check_source_changes and the plan report read."""
        return {
            "held": accumulator["held"],
            "changed": accumulator["changed"][0],
            "changed_examples": accumulator["changed"][1],
            "removed": accumulator["removed"][0],
            "removed_examples": accumulator["removed"][1],
        }
