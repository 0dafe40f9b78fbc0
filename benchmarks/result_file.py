"""argparse's type for a results file written only at the end of a run
(--json FILE): checked when the arguments are read, so that a typo costs an
error, not the run's results. As the C++ benchmarks' check
(benchmarks/common/writable_file.h): the path is not a directory, and its
directory exists and takes new files."""
import argparse
import os
import tempfile


def writable(path):
    if not path:
        return path  # "" means: no file
    if os.path.isdir(path) or path.endswith(os.sep):
        raise argparse.ArgumentTypeError(
            "cannot write the file %s: it names a directory; give the path of a file" % path)
    directory = os.path.dirname(os.path.abspath(path))
    try:
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".result-check-"):
            pass
    except OSError as e:
        raise argparse.ArgumentTypeError(
            "cannot create files in %s: %s" % (directory, e.strerror or e)) from None
    return path
