"""The `fusedopt` command of a pip-installed fusedopt: runs the CLI binary the wheel ships in
fusedopt/bin (`fusedopt bench`, `doctor`, `info`; `train` needs the libtorch build of scripts/build)."""

from __future__ import annotations

import os
import pathlib
import sys


def main() -> None:
    exe = pathlib.Path(__file__).resolve().parent / "bin" / "fusedopt"
    if not exe.is_file():
        sys.exit(f"fusedopt: no CLI binary at {exe}; this installation was built without it "
                 "(pip install . builds it; a source checkout has it at build/release/bin/fusedopt)")
    os.execv(exe, [str(exe), *sys.argv[1:]])
