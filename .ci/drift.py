"""Name every package whose version differs between two `pip freeze` listings (the lock and another install).

    python3 .ci/drift.py .ci/constraints.txt newest-freeze.txt
prints one line per package, "name: 5.24.0 (lock) -> 5.24.1 (newest)", or "no package differs from the lock".
"""

import re
import sys


def versions(path: str) -> dict[str, str]:
    found = {}
    for line in open(path, encoding="utf-8"):
        match = re.match(r"^([A-Za-z0-9_.\-]+)==(\S+)", line.strip())
        if match:
            found[re.sub(r"[-_.]+", "-", match.group(1)).lower()] = match.group(2)
    return found


def main(lock_path: str, other_path: str) -> None:
    lock, other = versions(lock_path), versions(other_path)
    lines = [
        f"{name}: {lock.get(name, 'absent')} (lock) -> {other.get(name, 'absent')} (newest)"
        for name in sorted(set(lock) | set(other))
        if lock.get(name) != other.get(name)
    ]
    print("\n".join(lines) if lines else "no package differs from the lock")


if __name__ == "__main__":
    main(*sys.argv[1:3])
