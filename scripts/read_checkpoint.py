#!/usr/bin/env python3
"""Reads a lockstep checkpoint (a safetensors file) with numpy only.

    import read_checkpoint
    tensors, metadata = read_checkpoint.load("ckpt-0000001000.safetensors")
    tensors["fc1.weight"]  # a numpy array

From the command line it lists the tensors (name, dtype, shape):

    python3 scripts/read_checkpoint.py FILE [--digest] [--no-verify]

--digest prints, per tensor, the CRC-32 of its values as little-endian
float64 (what the C++ tests compare against). The checksums lockstep writes
into the header metadata ("lockstep.checksum", "lockstep.tensor_crc32") are
verified unless --no-verify is given; files without them load unverified.
BF16 tensors come back as float32 (numpy has no bfloat16).

A training checkpoint (fashion_mnist, gpt_train, train/training_checkpoint.h)
names the model's weights and buffers "model.<name>" (its state_dict under
its module path, e.g. "model.fc1.weight") and the optimizer's state
"optimizer.state.<i>.<key>" (<i> the parameter's index in the optimizer,
<key> PyTorch's name: momentum_buffer, step, exp_avg, exp_avg_sq); the rest
(optimizer groups, schedule, progress, random generators) is metadata.
docs/checkpoints.md lists every name.
"""

import argparse
import json
import re
import signal
import struct
import sys
import zlib

import numpy as np

_DTYPES = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"),  # widened to float32 below
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "I16": np.dtype("<i2"),
    "I8": np.dtype("i1"),
    "U8": np.dtype("u1"),
    "BOOL": np.dtype("?"),
}
_MAX_HEADER = 100_000_000
# The quoted key followed by ':' is the real key: quotes inside JSON strings
# are escaped (see runtime/checkpoint/safetensors.cpp).
_CHECKSUM = re.compile(rb'"lockstep\.checksum" *: *"crc32:([0-9a-f]{8})"')


class CheckpointError(Exception):
    pass


def _no_duplicates(path):
    """A json object_pairs_hook refusing a name given twice, as lockstep does
    (json.loads would keep the last one without a word)."""
    def hook(pairs):
        seen = {}
        for key, value in pairs:
            if key in seen:
                raise CheckpointError(f"{path}: the header names '{key}' twice")
            seen[key] = value
        return seen
    return hook


def load(path, verify=True):
    """Returns ({name: np.ndarray} in file order, {metadata key: value}).

    The metadata comes without lockstep's checksums: they hold for this file's
    bytes only, and a file saved again with them (other tensors, or the same
    in another order) would be refused by lockstep as corrupt."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        raise CheckpointError(f"{path}: {len(data)} bytes, shorter than the length prefix")
    (n,) = struct.unpack("<Q", data[:8])
    if n > _MAX_HEADER or 8 + n > len(data):
        raise CheckpointError(f"{path}: header length {n} does not fit a {len(data)}-byte file")
    header_bytes = data[8 : 8 + n]
    header = json.loads(header_bytes, object_pairs_hook=_no_duplicates(path))
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: the header is JSON but not an object")
    metadata = header.pop("__metadata__", None) or {}  # null means none, as in safetensors
    # By (begin, end), as safetensors and lockstep order them: an empty tensor
    # may share its offset with the next one and come after it in the header.
    entries = sorted(header.items(), key=lambda kv: tuple(kv[1]["data_offsets"]))
    start = 8 + n

    if verify and "lockstep.checksum" in metadata:
        m = _CHECKSUM.search(header_bytes)
        if m is None:
            raise CheckpointError(f"{path}: malformed lockstep.checksum")
        zeroed = data[: 8 + m.start(1)] + b"00000000" + data[8 + m.end(1) :]
        crc = zlib.crc32(zeroed)
        if crc != int(m.group(1), 16):
            raise CheckpointError(
                f"{path}: checksum mismatch: stored {m.group(1).decode()}, computed {crc:08x}")

    tensor_crcs = None
    if verify and "lockstep.tensor_crc32" in metadata:
        tensor_crcs = [int(c, 16) for c in metadata["lockstep.tensor_crc32"].split(",") if c]
        if len(tensor_crcs) != len(entries):
            raise CheckpointError(f"{path}: lockstep.tensor_crc32 lists {len(tensor_crcs)} "
                                  f"checksums for {len(entries)} tensors")

    tensors = {}
    expected_begin = 0
    for i, (name, info) in enumerate(entries):
        begin, end = info["data_offsets"]
        if begin != expected_begin:
            raise CheckpointError(f"{path}: tensor '{name}' starts at {begin}, expected {expected_begin}")
        expected_begin = end
        raw = data[start + begin : start + end]
        if len(raw) != end - begin:
            raise CheckpointError(f"{path}: truncated in tensor '{name}'")
        if tensor_crcs is not None and zlib.crc32(raw) != tensor_crcs[i]:
            raise CheckpointError(f"{path}: tensor '{name}' fails its checksum")
        dtype = info["dtype"]
        if dtype not in _DTYPES:
            raise CheckpointError(f"{path}: tensor '{name}' has unsupported dtype {dtype}")
        shape = tuple(info["shape"])
        array = np.frombuffer(raw, dtype=_DTYPES[dtype]).reshape(shape)
        if dtype == "BF16":  # bfloat16 is the top half of a float32
            # Shifted in place: `a << 16` of a 0-d array is a numpy scalar,
            # an int64 under numpy 1.x, which cannot be viewed as float32.
            wide = array.astype(np.uint32)
            wide <<= np.uint32(16)
            array = wide.view(np.float32)
        tensors[name] = array.copy()
    if start + expected_begin != len(data):
        raise CheckpointError(f"{path}: the data ends at {start + expected_begin}, the file at {len(data)}")
    metadata.pop("lockstep.checksum", None)
    metadata.pop("lockstep.tensor_crc32", None)
    return tensors, metadata


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("file")
    parser.add_argument("--digest", action="store_true", help="CRC-32 of each tensor's float64 values")
    parser.add_argument("--no-verify", action="store_true", help="skip the checksums")
    args = parser.parse_args()
    try:
        tensors, metadata = load(args.file, verify=not args.no_verify)
    except (CheckpointError, ValueError, KeyError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    for name, a in tensors.items():
        line = f"{name} {a.dtype} {list(a.shape)}"
        if args.digest:
            line += f" {zlib.crc32(np.ascontiguousarray(a, dtype='<f8').tobytes()):08x}"
        print(line)
    for key, value in sorted(metadata.items()):
        print(f"metadata {key}={value}")
    return 0


if __name__ == "__main__":
    # A reader that has gone (`| head`) ends the listing quietly, as it ends cat.
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    sys.exit(main())
