"""One line naming this machine for a benchmark's table and JSON:
"Intel(R) Xeon(R) Processor, 2 cores" (the CPU model from /proc/cpuinfo where
there is one, else what Python's platform module knows)."""
import os
import platform


def describe():
    model = None
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{model or platform.processor() or platform.machine()}, {os.cpu_count()} cores"
