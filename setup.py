"""The compiled parts, all optional: the Kineto decode's inner loop (plasmient_report/parsers/kineto/_scan.c), the nsys
GPU metrics' page reader (plasmient_report/parsers/nsys/_sqlpages.c) and the Perfetto writer's protobuf encoder
(plasmient_report/render/_pbenc.c). Where they cannot be built (no C compiler) the
package installs without them and does the same work in Python and numpy: the same rows, the same bytes."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "plasmient_report.parsers.kineto._scan",
            ["plasmient_report/parsers/kineto/_scan.c"],
            extra_compile_args=["-O2"],
            optional=True,
        ),
        Extension(
            "plasmient_report.parsers.nsys._sqlpages",
            ["plasmient_report/parsers/nsys/_sqlpages.c"],
            extra_compile_args=["-O2"],
            optional=True,
        ),
        Extension(
            "plasmient_report.render._pbenc",
            ["plasmient_report/render/_pbenc.c"],
            extra_compile_args=["-O2"],
            optional=True,
        ),
    ]
)
