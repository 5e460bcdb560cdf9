"""The wheel builds from pyproject.toml without a setuptools warning, and carries every module and the package data.

setuptools turns a deprecated setting into a failed build after its due date (``project.license`` as a TOML table:
2027-02-18), so a deprecation warning from our configuration fails here first. The build runs setuptools' own backend
(``setuptools.build_meta``, as pip and ``python -m build`` do) on a copy of the project, in a subprocess where every
``SetuptoolsWarning`` is an error."""

import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FILE_OPERATIONS = ("copying ", "adding ", "creating ", "writing ", "reading ", "removing ")  # the build's file lines

BUILD_WHEEL = """
import sys, warnings
from setuptools.warnings import SetuptoolsWarning
warnings.simplefilter("error", SetuptoolsWarning)
import setuptools.build_meta as backend
print("WHEEL", backend.build_wheel(sys.argv[1]))
"""


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    """``(wheel path, build output)``: the wheel built from a copy of pyproject.toml, README.md and nvflare_moon/."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        found = version("setuptools")
    except PackageNotFoundError:
        found = None
    if found is None or int(found.split(".")[0]) < 77:  # pyproject's [build-system] requires setuptools>=77
        pytest.fail(f"setuptools {found} here, [build-system] requires setuptools>=77: pip install -e '.[test]'")
    source = tmp_path_factory.mktemp("source")
    shutil.copy(REPO / "pyproject.toml", source)
    shutil.copy(REPO / "README.md", source)  # project.readme
    shutil.copytree(REPO / "nvflare_moon", source / "nvflare_moon", ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp_path_factory.mktemp("wheel")
    # PYTHONDONTWRITEBYTECODE only adds build_py's "byte-compiling is disabled" line, which is not about pyproject
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    completed = subprocess.run(
        [sys.executable, "-c", BUILD_WHEEL, str(out)],
        cwd=source,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    output = completed.stdout + completed.stderr
    assert completed.returncode == 0, f"the wheel build failed (a setuptools warning is an error here):\n{output}"
    return out / re.search(r"^WHEEL (\S+)$", completed.stdout, re.MULTILINE).group(1), output


def test_the_build_prints_no_warning(wheel):
    _, output = wheel
    lines = [line for line in output.splitlines() if not line.startswith(FILE_OPERATIONS)]  # not a module's name
    warnings = [line for line in lines if "warning" in line.lower() or "deprecat" in line.lower()]
    assert not warnings, "the wheel build warns; fix the setting in pyproject.toml:\n" + "\n".join(warnings)


def test_the_wheel_carries_every_module_and_the_package_data(wheel):
    path, _ = wheel
    names = set(zipfile.ZipFile(path).namelist())
    assert "nvflare_moon/recipes/job_custom/README.md" in names  # [tool.setuptools.package-data]
    methods = {p.relative_to(REPO).as_posix() for p in (REPO / "nvflare_moon" / "methods").glob("*.py")}
    assert "nvflare_moon/methods/moon.py" in methods and methods <= names
    modules = {
        p.relative_to(REPO).as_posix() for p in (REPO / "nvflare_moon").rglob("*.py") if "__pycache__" not in p.parts
    }
    assert not modules - names, f"modules missing from the wheel (a folder without __init__.py?): {modules - names}"
    metadata = zipfile.ZipFile(path).read(f"{path.name.split('-py3')[0]}.dist-info/METADATA").decode()
    assert "License-Expression: Apache-2.0" in metadata.splitlines()
