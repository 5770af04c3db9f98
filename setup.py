"""Build the private C extension layernorm_c._core.

The default build is portable: it never uses -march=native. The AVX2 and
AVX-512 kernels carry per-function target attributes and are chosen at run
time. -ffp-contract=off stops the compiler from fusing multiply-adds on its
own: the kernels fuse them only where their formulas say so (fmaf in scalar
code, vfmadd in SIMD code), which is what keeps the levels bit-identical.
-fno-math-errno lets sqrt be the instruction (scalar or vector) rather than
a call that sets errno for a negative argument, which nothing reads: the
same values, and loops over records' square roots vectorize.

LAYERNORM_C_RELEASE=1 (set by the cibuildwheel configuration in
pyproject.toml) builds a release extension without debug information:
-g0 after Python's own compiler flags (which often hold -g), and -Wl,-S
for the linker to drop any debug sections left. The default build keeps
Python's flags. MSVC release builds carry no debug information anyway.

LAYERNORM_C_WERROR=1 (set by .ci/run) makes every warning an error
(-Werror, with -Wmissing-field-initializers on): CI's builds must be
warning-free with GCC and clang. A user's build never uses -Werror, so a
newer compiler's new warning cannot break an install.

LAYERNORM_C_OPT=-O1 (or -O0, -O2) replaces -O3, for tools/sanitize.sh:
GCC at -O3 with ASan + UBSan takes about ten minutes for each kernel file
(with -g, an object of 1 MB grows to 80 once instrumented); -O1, the level
the sanitizers' documentation recommends, about one and a half.

On x86 GCC, the kernels' fixed-size local arrays (lane accumulators, row
buffers) are zeroed with vector stores (-mmemset-strategy, when the
compiler takes it): GCC's generic tuning uses `rep stosq`, whose start-up
cost per record was 15% of the forward's sum passes at d = 768 (AMD Zen 3,
perf); float32 (64, 768) and (4096, 768) LayerNorm 10-13% faster.

The sources compile side by side, one compiler process per core
(LAYERNORM_C_BUILD_JOBS=N sets how many; 1 compiles them one after the
other): setuptools builds the files of one extension one at a time, and
the three kernel files take about 25 s each at -O3.
"""
import os
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

try:
    from setuptools.errors import CompileError
except ImportError:  # setuptools < 59
    from distutils.errors import CompileError

# A quick file first (it compiles alone, see ParallelBuildExt), then the
# slowest, so that side by side the compilers finish together.
SOURCES = [
    "csrc/_coremodule.c",
    "csrc/ln_avx2.c",
    "csrc/ln_portable.c",
    "csrc/ln_avx512.c",
    "csrc/ln_scalar.c",
    "csrc/ln_batch.c",
    "csrc/ln_stage.c",
    "csrc/ln_pool.c",
    "csrc/ln_cache.c",
    "csrc/ln_accum.c",
    "csrc/ln_dispatch.c",
]

HEADERS = [
    "csrc/layernorm.h", "csrc/ln_contract.h", "csrc/ln_half.h", "csrc/ln_pool.h",
    "csrc/ln_cache.h", "csrc/ln_stage.h", "csrc/ln_tmpl.h", "csrc/ln_level.h", "csrc/ln_instance.h",
    "csrc/ln_ref.h", "csrc/ln_lane.h", "csrc/ln_elem.h", "csrc/ln_record.h",
    "csrc/ln_ops.h", "csrc/ln_x86.h", "csrc/ln_accum.h",
]

if sys.platform == "win32":
    compile_args = ["/O2", "/fp:precise"]
    link_args = []
else:
    opt = os.environ.get("LAYERNORM_C_OPT", "") or "-O3"
    if opt not in ("-O0", "-O1", "-O2", "-O3"):
        sys.exit(f"setup.py: LAYERNORM_C_OPT must be -O0, -O1, -O2 or -O3, not {opt!r}")
    # -fvisibility=hidden: the module exports PyInit__core and the two
    # threadpoolctl functions (LN_EXPORT), not every non-static function of
    # the C core (ln_batch_run, ln_acc_*, ...), whose names another library
    # loaded into the process could share.
    compile_args = [opt, "-std=c11", "-ffp-contract=off", "-fno-fast-math", "-fno-math-errno",
                    "-fvisibility=hidden", "-Wall", "-Wextra", "-Wno-unused-parameter"]
    link_args = ["-pthread"]
    if os.environ.get("LAYERNORM_C_RELEASE", "") not in ("", "0"):
        compile_args.append("-g0")
        link_args.append("-Wl,-S")
    if os.environ.get("LAYERNORM_C_WERROR", "") not in ("", "0"):
        compile_args += ["-Wmissing-field-initializers", "-Werror"]


def build_jobs():
    """How many compiler processes to run at once (LAYERNORM_C_BUILD_JOBS,
    else one per core)."""
    text = os.environ.get("LAYERNORM_C_BUILD_JOBS", "")
    if not text:
        return os.cpu_count() or 1
    if not text.isdigit() or int(text) < 1:
        sys.exit(f"setup.py: LAYERNORM_C_BUILD_JOBS must be a positive integer, not {text!r}")
    return int(text)


MEMSET_FLAG = "-mmemset-strategy=vector_loop:4096:noalign,libcall:-1:noalign"


def compiler_takes(compiler, flag):
    """Does the compiler build a trivial file with flag (as an error if
    unknown)? Only x86 GCC knows -mmemset-strategy."""
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "probe.c")
        with open(src, "w") as f:
            f.write("int main(void) { return 0; }\n")
        try:
            compiler.compile([src], output_dir=tmp, extra_postargs=[flag, "-Werror"])
        except CompileError:
            return False
    return True


class ParallelBuildExt(build_ext):
    """build_ext whose compiler takes an extension's sources several at a
    time. Each source goes through the compiler's own compile() (flags,
    dependency checks, output paths unchanged); the first one alone, so
    that it creates the output folders before the others run."""

    def build_extension(self, ext):
        if self.compiler.compiler_type == "unix" and compiler_takes(self.compiler, MEMSET_FLAG):
            ext.extra_compile_args = list(ext.extra_compile_args) + [MEMSET_FLAG]
        jobs = build_jobs()
        serial_compile = self.compiler.compile
        if jobs > 1:
            def compile_sources(sources, *args, **kwargs):
                if len(sources) < 2:
                    return serial_compile(sources, *args, **kwargs)
                objects = serial_compile(sources[:1], *args, **kwargs)
                with ThreadPoolExecutor(max_workers=jobs) as pool:
                    rest = pool.map(lambda src: serial_compile([src], *args, **kwargs),
                                    sources[1:])
                    for one in rest:
                        objects += one
                return objects
            self.compiler.compile = compile_sources
        try:
            super().build_extension(ext)
        finally:
            self.compiler.compile = serial_compile


setup(
    cmdclass={"build_ext": ParallelBuildExt},
    ext_modules=[
        Extension(
            "layernorm_c._core",
            sources=SOURCES,
            depends=HEADERS,
            include_dirs=[np.get_include(), "csrc"],
            extra_compile_args=compile_args,
            extra_link_args=link_args,
        )
    ]
)
