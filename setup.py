"""The one compiled part: the Kineto decode's inner loop (plasmient_report/parsers/kineto/_scan.c). Optional: where it
cannot be built (no C compiler) the package installs without it and decodes with msgspec alone, the same rows."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "plasmient_report.parsers.kineto._scan",
            ["plasmient_report/parsers/kineto/_scan.c"],
            extra_compile_args=["-O2"],
            optional=True,
        )
    ]
)
