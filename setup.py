"""Build hook for the optional native write lane; all metadata lives in pyproject.toml.

The extension is optional: where it cannot be compiled (no C compiler, not Linux),
the package installs anyway and the queue writes through its Python I/O thread.
"""

import sys

from setuptools import Extension, setup

ext_modules = []
if sys.platform.startswith("linux"):
    ext_modules.append(Extension(
        "aiodiskqueue._core._writer",
        sources=["aiodiskqueue/_core/_writer.c"],
        extra_compile_args=["-O2", "-std=gnu11"],
        optional=True,
    ))

setup(ext_modules=ext_modules)
