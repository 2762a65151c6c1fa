"""The spec's walk: every call into the job's own code that is handed the ConversionSpec, from
``convert()`` to the pipeline's submission, in call order.

    python benchmarks/spec_walk.py

A run is described once, by the spec, and handed down; a module that is entered, left and entered
again (a call that runs back up) is a place where two parts of the job share a decision. The
walk is traced with ``sys.setprofile`` while ``convert()`` builds the pipeline of 4 photos for a
runner that only keeps it (nothing is converted), so it ends where a real run would start its
workers; the commit runs inside the pipeline and is handed no spec.
"""

from __future__ import annotations

import pathlib
import sys
import tempfile

from apache_beam.runners.runner import PipelineResult, PipelineRunner, PipelineState

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


class KeepingRunner(PipelineRunner):
    """Ends the trace where a real runner would start: the pipeline is built, nothing runs."""

    def run_pipeline(self, pipeline, options):
        sys.setprofile(None)
        return PipelineResult(PipelineState.DONE)


def main() -> None:
    import beam_jobs  # pylint: disable=import-outside-toplevel
    from beam_jobs.sample_data import make_photo_tree  # pylint: disable=import-outside-toplevel

    walk: list[tuple[str, str]] = []

    def follow(frame, event, _arg):
        code = frame.f_code
        if event != "call" or "/beam_jobs/" not in code.co_filename:
            return
        if frame.f_back is not None and frame.f_back.f_code.co_name == "__post_init__":
            return  # a spec checking itself as it is built, like a method handed ``self``: no step of the walk
        names = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]
        if any(type(frame.f_locals.get(name)).__name__ == "ConversionSpec" for name in names if name != "self"):
            walk.append((code.co_filename.split("/beam_jobs/")[-1], code.co_name))

    with tempfile.TemporaryDirectory() as scratch:
        photos = pathlib.Path(scratch) / "photos"
        make_photo_tree(photos, num_images=4)
        sys.setprofile(follow)
        try:
            beam_jobs.convert(
                str(photos), output_dir=str(pathlib.Path(scratch) / "out"), runner=f"{__name__}.KeepingRunner"
            )
        except OSError:
            pass  # nothing ran, so there is no dataset_info.json to read back
        finally:
            sys.setprofile(None)
    modules = [module for module, _ in walk]
    entered = [module for index, module in enumerate(modules) if index == 0 or modules[index - 1] != module]
    returns = sum(1 for index, module in enumerate(entered) if module in entered[:index])
    for module, function in walk:
        print(f"{module}:{function}")
    print(
        f"\n{len(walk)} calls handed the spec, in {len(set(modules))} modules; {len(entered)} modules entered, "
        f"{returns} of them entered again after being left"
    )


if __name__ == "__main__":
    main()
