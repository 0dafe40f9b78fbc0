#!/usr/bin/env python3
"""Kills ranks of a training run at random moments and checks that
lockstep-run --max-restarts brings it to the uninterrupted run's end.

Three runs of fashion_mnist through lockstep-run, the same recipe each time:
  straight      no checkpoints: the reference digest and per-step losses;
  checkpointed  with --checkpoint-dir, undisturbed: the checkpoints' cost;
  chaos         checkpointed, with --max-restarts KILLS, while this script
                SIGKILLs a rank KILLS times. The moments cycle through three
                kinds: start-up (as soon as an attempt's ranks exist, before
                they have formed their group), a checkpoint write (rank 0,
                while a checkpoint's temporary file exists; when none shows
                within the run's expected time, a random moment instead),
                and a random moment in training (forward, backward and the
                all-reduce, in proportion to their time).
It passes when the chaos run ends with the straight run's parameters digest,
every step it logged has the straight run's loss, and the launcher restarted
once per kill. Prints a table, then one JSON line (--json FILE writes it too):
the kills by kind, the time lost per restart (the chaos run's wall time over
the checkpointed run's, per kill) and the checkpoint overhead per step.

  benchmarks/chaos_restart.py --build build --kills 10            # the long run
  benchmarks/chaos_restart.py --build build --kills 3 --quick     # what ctest runs

Exit status: 0 when it passed, 1 when not, 2 for bad arguments or a missing
binary or dataset.
"""
import argparse
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

import result_file

DATA = "/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz"


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default="build", help="build directory (with bin/)")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--kills", type=int, default=10)
    ap.add_argument("--seed", type=int, default=1, help="seeds the kill moments and ranks")
    ap.add_argument("--quick", action="store_true",
                    help="2048 training samples, 2 epochs (the default: 8192, 3 epochs)")
    ap.add_argument("--checkpoint-every", type=int, default=5)
    ap.add_argument("--json", type=result_file.writable, help="also write the JSON result here")
    a = ap.parse_args()
    if a.ranks < 1 or a.kills < 1 or a.checkpoint_every < 1:
        ap.error("--ranks, --kills and --checkpoint-every must be at least 1")
    return a


def recipe(a):
    samples, epochs = (2048, 2) if a.quick else (8192, 3)
    return ["--model", "mlp", "--train-samples", str(samples), "--test-samples", "1000",
            "--batch-size", "64", "--epochs", str(epochs), "--optimizer", "adam",
            "--lr-schedule", "cosine", "--log-every", "1"]


def parse_run(output):
    digest = re.findall(r"parameters digest: ([0-9a-f]+)", output)
    losses = {}
    for where, loss in re.findall(r"(epoch \d+ step \d+)/\d+ loss ([0-9.]+)", output):
        losses.setdefault(where, set()).add(loss)
    return (digest[-1] if digest else None), losses


def run(cmd, timeout):
    start = time.monotonic()
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=timeout)
    return p.returncode, p.stdout, time.monotonic() - start


def children(pid, name):
    """Pids of `pid`'s children whose command name is `name`."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % entry) as f:
                stat = f.read()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1:stat.rindex(")")]
        ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        if ppid == pid and comm == name:
            found.append(int(entry))
    return sorted(found)


def rank_pids(launcher, ranks):
    """The rank pids of the launcher's current attempt (all `ranks` alive), or []."""
    pids = children(launcher, "fashion_mnist")
    return pids if len(pids) == ranks else []


def rank_zero(pids):
    """The pid of rank 0 among `pids` (from its environment)."""
    for pid in pids:
        try:
            with open("/proc/%d/environ" % pid, "rb") as f:
                if b"\0LOCKSTEP_RANK=0\0" in b"\0" + f.read():
                    return pid
        except OSError:
            pass
    return pids[0]


def temp_files(directory):
    """Names of the checkpoint temporary files in `directory` (one being written, or
    one a killed writer left, which the next run sets aside)."""
    try:
        return {name for name in os.listdir(directory) if ".tmp-" in name}
    except OSError:
        return set()


class Killer(threading.Thread):
    """SIGKILLs `kills` ranks of the launcher, one per attempt, cycling the kinds."""

    def __init__(self, launcher, ranks, kills, directory, expected_s, seed):
        super().__init__(daemon=True)
        self.launcher, self.ranks, self.kills = launcher, ranks, kills
        self.directory, self.expected_s = directory, expected_s
        self.rng = random.Random(seed)
        self.done = []  # (kind, seconds into the attempt)
        self.training_kills = kills // 3  # every third kill: k = 2, 5, 8, ...
        self.stop = False

    def wait_for_attempt(self, previous):
        """The next attempt's rank pids (none of `previous`), or [] once the run ended."""
        while not self.stop:
            pids = rank_pids(self.launcher.pid, self.ranks)
            if pids and not set(pids) & set(previous):
                return pids
            if self.launcher.poll() is not None:
                return []
            time.sleep(0.002)
        return []

    def run(self):
        kinds = ["start-up", "checkpoint", "training"]
        previous = []
        for k in range(self.kills):
            pids = self.wait_for_attempt(previous)
            if not pids:
                return
            began = time.monotonic()
            kind = kinds[k % len(kinds)]
            victim = self.rng.choice(pids)
            if kind == "checkpoint":
                # Rank 0 writes the checkpoints: catch it inside one (a
                # temporary file that was not there when the attempt began).
                victim = rank_zero(pids)
                old = temp_files(self.directory)
                deadline = began + self.expected_s
                while time.monotonic() < deadline and not temp_files(self.directory) - old:
                    time.sleep(0.0005)
                if not temp_files(self.directory) - old:
                    kind = "training (no checkpoint write caught)"
            elif kind == "training":
                # Each attempt resumes near where the last one died: short
                # enough that all the training kills together stay within one
                # run's length, so the run cannot end before the last kill.
                time.sleep(self.rng.uniform(0.2, 0.8) * self.expected_s / (self.training_kills + 1))
            try:
                os.kill(victim, signal.SIGKILL)
            except ProcessLookupError:
                return  # the run ended first
            self.done.append((kind, time.monotonic() - began))
            previous = pids


def main():
    a = parse_args()
    bin_dir = os.path.join(a.build, "bin")
    launcher_bin = os.path.join(bin_dir, "lockstep-run")
    program = os.path.join(bin_dir, "fashion_mnist")
    for path in (launcher_bin, program):
        if not os.access(path, os.X_OK):
            print("chaos_restart: %s is not built (cmake --build %s)" % (path, a.build),
                  file=sys.stderr)
            return 2
    if not os.path.exists(DATA):
        print("chaos_restart: Fashion-MNIST is not installed (apt-get install "
              "dataset-fashion-mnist)", file=sys.stderr)
        return 2

    base = [launcher_bin, "-np", str(a.ranks)]
    work = tempfile.mkdtemp(prefix="lockstep-chaos-")
    try:
        code, out, straight_s = run(base + [program] + recipe(a), 600)
        digest, losses = parse_run(out)
        if code != 0 or not digest:
            print(out + "\nchaos_restart: the straight run failed", file=sys.stderr)
            return 1
        steps = len(losses)

        ckpt = ["--checkpoint-dir", os.path.join(work, "calm"), "--checkpoint-every",
                str(a.checkpoint_every)]
        code, out, checkpointed_s = run(base + [program] + recipe(a) + ckpt, 600)
        calm_digest, _ = parse_run(out)
        if code != 0 or calm_digest != digest:
            print(out + "\nchaos_restart: the checkpointed run failed or differs", file=sys.stderr)
            return 1

        directory = os.path.join(work, "chaos")
        cmd = (base[:1] + ["--max-restarts", str(a.kills), "--restart-backoff", "0"] + base[1:] +
               [program] + recipe(a) +
               ["--checkpoint-dir", directory, "--checkpoint-every", str(a.checkpoint_every)])
        start = time.monotonic()
        launcher = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    text=True)
        killer = Killer(launcher, a.ranks, a.kills, directory, checkpointed_s, a.seed)
        killer.start()
        try:
            out, _ = launcher.communicate(timeout=600 + 60 * a.kills)
        except subprocess.TimeoutExpired:
            launcher.kill()
            out, _ = launcher.communicate()
            print(out + "\nchaos_restart: the chaos run timed out", file=sys.stderr)
            return 1
        chaos_s = time.monotonic() - start
        killer.stop = True
        killer.join()
        chaos_digest, chaos_losses = parse_run(out)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    restarts = len(re.findall(r"lockstep-run: restart \d+ of", out))
    wrong = sorted(w for w, seen in chaos_losses.items()
                   if w not in losses or seen != losses[w])
    kinds = {}
    for kind, _ in killer.done:
        kinds[kind] = kinds.get(kind, 0) + 1
    kills = len(killer.done)
    passed = (launcher.returncode == 0 and chaos_digest == digest and not wrong and
              kills == a.kills and restarts == kills)
    result = {
        "benchmark": "chaos_restart", "ranks": a.ranks, "kills_asked": a.kills,
        "kills": kills, "kills_by_kind": kinds, "restarts": restarts,
        "exit_code": launcher.returncode, "digest": digest, "chaos_digest": chaos_digest,
        "digest_equal": chaos_digest == digest, "steps": steps,
        "steps_logged": len(chaos_losses), "steps_with_other_loss": wrong[:10],
        "straight_s": round(straight_s, 3), "checkpointed_s": round(checkpointed_s, 3),
        "chaos_s": round(chaos_s, 3),
        "checkpoint_overhead_ms_per_step": round(1000 * (checkpointed_s - straight_s) / steps, 3),
        "lost_s_per_restart": round((chaos_s - checkpointed_s) / max(kills, 1), 3),
        "checkpoint_every": a.checkpoint_every, "passed": passed,
    }
    rows = [("kills survived", "%d of %d asked (%s)" % (
                 kills, a.kills, ", ".join("%s %d" % kv for kv in sorted(kinds.items())))),
            ("restarts by lockstep-run", str(restarts)),
            ("final digest", "%s (straight run %s): %s" % (
                chaos_digest, digest, "equal" if chaos_digest == digest else "DIFFERENT")),
            ("per-step losses", "%d steps logged, %d differ" % (len(chaos_losses), len(wrong))),
            ("wall time", "straight %.2f s, checkpointed %.2f s, chaos %.2f s" % (
                straight_s, checkpointed_s, chaos_s)),
            ("time lost per restart", "%.2f s" % result["lost_s_per_restart"]),
            ("checkpoint overhead", "%.2f ms per step (every %d steps)" % (
                result["checkpoint_overhead_ms_per_step"], a.checkpoint_every))]
    width = max(len(r[0]) for r in rows)
    print("| %-*s | result |" % (width, "chaos_restart, %d ranks" % a.ranks))
    print("|%s|--------|" % ("-" * (width + 2)))
    for name, value in rows:
        print("| %-*s | %s |" % (width, name, value))
    print("%s" % ("PASSED" if passed else "FAILED"))
    if not passed:
        print(out, file=sys.stderr)
    line = json.dumps(result)
    print(line)
    if a.json:
        with open(a.json, "w") as f:
            f.write(line + "\n")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
