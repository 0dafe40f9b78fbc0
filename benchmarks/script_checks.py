"""What the comparison scripts check before they run anything, so that bad
input costs one line naming it and exit status 2, not a traceback or a run
whose columns all failed: the build's programs, mpirun, PyTorch for the peer,
and argparse types for sizes ("4K", "64M") and lists ("1,2,4")."""
import argparse
import os
import shutil
import subprocess
import sys


def fail(script, message):
    """Prints "script: message" on stderr and exits with status 2."""
    sys.stderr.write(f"{script}: {message}\n")
    sys.exit(2)


def require_programs(script, build, names):
    """Every name is an executable in BUILD/bin."""
    for name in names:
        path = os.path.join(build, "bin", name)
        if not os.access(path, os.X_OK):
            fail(script, f"{path} not found; build it first (cmake --build {build} --target "
                         f"{' '.join(names)}), or give --build DIR")


def require_command(script, command, option):
    """command runs (a path, or a name on PATH); its full path."""
    found = shutil.which(command)
    if not found:
        fail(script, f"{command} not found (give its path with {option})")
    return found


def require_torch(script, python):
    """python imports torch; else says how to get it or skip the peer."""
    if not shutil.which(python):
        fail(script, f"{python} not found: the PyTorch peer needs it (--python PATH), "
                     "or skip the peer with --no-torch")
    probe = subprocess.run([python, "-c", "import torch"], capture_output=True)
    if probe.returncode != 0:
        fail(script, f"no PyTorch for {python} (apt-get install python3-torch, or --python "
                     "PATH), or skip the peer with --no-torch")


def byte_size(text):
    """argparse type: bytes as nccl-tests writes them, 4096, 4K, 64M, 1G."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    try:
        value = (float(text[:-1]) * units[text[-1].upper()] if text[-1:].upper() in units
                 else int(text))
    except ValueError:
        value = None
    if value is None or value < 1:
        raise argparse.ArgumentTypeError(f"'{text}' is not a size in bytes (4096, 4K, 64M, 1G)")
    return int(value)


def int_list(text):
    """argparse type: a comma-separated list of positive integers, "1,2,4"."""
    try:
        values = [int(x) for x in text.split(",") if x]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(
            f"'{text}' is not a comma-separated list of positive whole numbers (e.g. 1,2,4)")
    return values
