"""Installs tests/python/requirements-torch.txt into this interpreter's environment.

PyPI's torch wheel for Linux needs its CUDA libraries to import, about 4.5 GB installed,
and pulls triton (1 GB) that only ``torch.compile`` uses. So torch and s3torchconnector
are installed without dependencies, then their dependencies less triton. Nothing is kept
in pip's cache. Where the disk has too little room, nothing is installed and the tests
that need torch skip; this prints why.
"""

import importlib.metadata as md
import shutil
import subprocess
import sys
from pathlib import Path

from packaging.requirements import Requirement

HERE = Path(__file__).resolve().parent
REQUIREMENTS = HERE / "requirements-torch.txt"
LEFT_OUT = {"triton"}
# Installed size plus the wheels pip holds while it installs them.
NEEDS_GIB = 8.0


def wanted():
    lines = (l.split("#")[0].strip() for l in REQUIREMENTS.read_text().splitlines())
    return [Requirement(l) for l in lines if l]


def satisfied(req):
    try:
        return req.specifier.contains(md.version(req.name), prereleases=True)
    except md.PackageNotFoundError:
        return False


def pip(*args):
    cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
           "--no-cache-dir", *args]
    # pip warns that torch wants triton; that is the point, so the warning is not shown.
    run = subprocess.run(cmd, stderr=subprocess.PIPE, text=True)
    for line in run.stderr.splitlines():
        if "requires triton" not in line and "dependency resolver does not" not in line \
                and "dependency conflicts" not in line:
            print(line, file=sys.stderr)
    if run.returncode:
        sys.exit(run.returncode)


def dependencies(names):
    """The installed packages' own requirements that apply here, less ours and LEFT_OUT."""
    out = []
    for name in names:
        for text in md.requires(name) or []:
            req = Requirement(text)
            if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                continue
            if req.name in names or req.name in LEFT_OUT:
                continue
            req.marker = None
            out.append(str(req))
    return out


def main():
    reqs = wanted()
    names = [r.name for r in reqs]
    if all(satisfied(r) for r in reqs) and all(
            satisfied(Requirement(d)) for d in dependencies(names)):
        print("torch: already installed,", ", ".join(f"{r.name} {md.version(r.name)}" for r in reqs))
        return
    free = shutil.disk_usage(sys.prefix).free / 2**30
    if free < NEEDS_GIB:
        print(f"torch: NOT installed: {free:.1f} GiB free under {sys.prefix}, it needs about "
              f"{NEEDS_GIB:.0f}; the tests that need torch will skip")
        return
    pip("--no-deps", *(str(r) for r in reqs))
    pip(*dependencies(names))
    print("torch: installed,", ", ".join(f"{n} {md.version(n)}" for n in names),
          f"(left out: {', '.join(sorted(LEFT_OUT))})")


if __name__ == "__main__":
    main()
