"""Build hook for the optional native write lane; all metadata lives in pyproject.toml.

The extension is optional: where it cannot be compiled (no C compiler, not Linux),
the package installs anyway and the queue writes through its Python I/O thread.
Such a wheel holds no compiled code and is tagged ``py3-none-any``, so it is
never mistaken for one that carries the native writer.

``AIODISKQUEUE_NATIVE`` chooses: ``auto`` (default: build it if a compiler
works), ``1`` (required: the build fails with the compiler's error if it
cannot be built) or ``0`` (never build it: a pure wheel).
"""

from __future__ import annotations

import os
import sys

from setuptools import Extension, setup
from setuptools.command.bdist_wheel import bdist_wheel  # setuptools >= 70.1
from setuptools.command.build_ext import build_ext

NATIVE_ENV = "AIODISKQUEUE_NATIVE"
NATIVE = os.environ.get(NATIVE_ENV, "auto").strip().lower() or "auto"
if NATIVE not in ("auto", "0", "1"):
    raise SystemExit(f"{NATIVE_ENV} must be auto, 0 or 1, got {NATIVE!r}")
if NATIVE == "1" and not sys.platform.startswith("linux"):
    raise SystemExit(f"{NATIVE_ENV}=1: the native writer needs Linux, this is {sys.platform}")

WRITER = Extension(
    "aiodiskqueue._core._writer",
    sources=["aiodiskqueue/_core/_writer.c"],
    extra_compile_args=["-O2", "-std=gnu11"],
)


class OptionalBuildExt(build_ext):
    """Build the writer; in ``auto`` mode a failure leaves a pure-Python package."""

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as exc:  # CompileError, LinkError, a missing compiler ...
            if NATIVE == "1":
                raise SystemExit(
                    f"{NATIVE_ENV}=1 but the native writer {ext.name} could not be "
                    f"built: {exc}") from exc
            self.warn(f"the native writer {ext.name} could not be built ({exc}); "
                      "the package will write through its Python I/O thread")
            # Without compiled code the install (and a wheel) is pure: install puts the
            # package in purelib, and bdist_wheel tags it py3-none-any.
            self.distribution.ext_modules = []


class TaggedBdistWheel(bdist_wheel):
    """A wheel without the compiled writer is a pure wheel (``py3-none-any``)."""

    def run(self) -> None:
        if not self.skip_build:
            self.run_command("build")
        if not self.distribution.has_ext_modules():
            self.root_is_pure = True
        super().run()


ext_modules = []
if NATIVE != "0" and sys.platform.startswith("linux"):
    ext_modules.append(WRITER)

setup(
    ext_modules=ext_modules,
    cmdclass={"build_ext": OptionalBuildExt, "bdist_wheel": TaggedBdistWheel},
)
