"""``python -m beam_jobs``: the same as the images-to-tfrecords console script."""

from beam_jobs.command_line.cli import main

if __name__ == "__main__":
    main()
