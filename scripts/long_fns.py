#!/usr/bin/env python3
"""Functions longer than a limit (default 70 lines) in the given Rust
sources: `python3 scripts/long_fns.py [LIMIT] crates/engine/src`."""
import os
import re
import sys

limit = int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].isdigit() else 70
roots = [a for a in sys.argv[1:] if not a.isdigit()] or ["crates/engine/src"]
found = 0
for root in roots:
    for d, _, files in os.walk(root):
        for f in sorted(files):
            if not f.endswith(".rs"):
                continue
            path = os.path.join(d, f)
            lines = open(path).read().split("\n")
            for i, line in enumerate(lines):
                m = re.match(r"^(\s*)(?:pub(?:\([a-z]+\))? )?(?:const )?fn ([a-z_0-9]+)", line)
                if not m or line.rstrip().endswith(";"):
                    continue
                indent = m.group(1)
                for j in range(i + 1, len(lines)):
                    if lines[j] == indent + "}":
                        n = j - i + 1
                        if n > limit:
                            print("%4d  %s:%d  %s" % (n, path, i + 1, m.group(2)))
                            found += 1
                        break
sys.exit(1 if found else 0)
