"""The compiled part of vocabbridge: ``vocabbridge._q4``, the row-invariant 4-bit CPU matmul behind
``--kernels q4`` (csrc/q4/q4.c). Plain C and the CPython API, no torch headers, so pip builds it in
its isolated build environment with the system's C compiler; one build serves AVX2 and AVX-512
CPUs (each kernel is compiled for its vector unit and chosen at run time).

Where no C compiler exists the build of this extension fails and the package installs without it
(``optional=True``); ``--kernels q4`` then says how to get it (vocabbridge/engine/q4.py)."""

import sys

from setuptools import Extension, setup

compile_args = [] if sys.platform == "win32" else ["-O3", "-std=gnu11", "-ffp-contract=off", "-fno-math-errno"]
link_args = [] if sys.platform in ("win32", "darwin") else ["-pthread"]

setup(
    ext_modules=[
        Extension(
            "vocabbridge._q4",
            sources=["csrc/q4/q4.c"],
            extra_compile_args=compile_args,
            extra_link_args=link_args,
            optional=True,
        )
    ]
)
