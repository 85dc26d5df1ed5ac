"""Where a process's resident memory is, at its peak: samples /proc/PID/smaps every 500 ms
until the process exits and prints the largest total with its parts (the heap, and the
mapped files of a shadowbrain data directory's store/, vectors/ and keywords/), then each
part's own peak. VmHWM counts the same pages, but not which map they belong to.

    python3 bench/smaps_peak.py PID
"""

import collections
import os
import re
import sys
import time

HEADER = re.compile(r"^[0-9a-f]+-[0-9a-f]+ ")


def part_of(path):
    """The part a mapping counts under."""
    if "/keywords/" in path:
        return "keywords"
    if "/vectors" in path:
        return "vectors"
    if "/store/" in path:
        return "store"
    return "other files" if path.startswith("/") else "heap and other anonymous"


def sample(pid):
    """Resident KiB per part, now."""
    parts = collections.Counter()
    part = None
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            if HEADER.match(line):
                fields = line.split(None, 5)
                part = part_of(fields[5].strip() if len(fields) > 5 else "")
            elif line.startswith("Rss:"):
                parts[part] += int(line.split()[1])
    return parts


def mib(kib):
    return f"{kib / 1024:.0f} MiB"


def main():
    pid = sys.argv[1]
    peaks = collections.Counter()
    best, best_parts = 0, {}
    while os.path.exists(f"/proc/{pid}"):
        try:
            parts = sample(pid)
        except OSError:
            break
        for k, v in parts.items():
            peaks[k] = max(peaks[k], v)
        if sum(parts.values()) > best:
            best, best_parts = sum(parts.values()), dict(parts)
        time.sleep(0.5)
    print(f"peak {mib(best)}: " + ", ".join(f"{k} {mib(v)}" for k, v in sorted(best_parts.items())))
    print("each part's own peak: " + ", ".join(f"{k} {mib(v)}" for k, v in sorted(peaks.items())))


if __name__ == "__main__":
    main()
