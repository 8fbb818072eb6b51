"""Installs the `sglang` package from python/ (clean-room SGLang-compatible engine).

The fused CPU kernels (python/sglang/srt/kernels/cpu/csrc) are compiled here, at install time, as
ordinary extension modules (torch's `BuildExtension`), one per build of the one ISA vocabulary
(kernels/cpu/isa.py: avx512bf16, avx512, avx2, portable), so nothing is compiled when a server
starts. `pip install -e .` (used by `make setup`) or `python setup.py build_ext --inplace` builds
them; they need the torch the package runs with, so install torch first and pass
`--no-build-isolation` to pip. Without torch or a C++ compiler the package installs without them
and the engine uses its torch code. SGLANG_BUILD_CPU_KERNELS=0 skips them;
SGLANG_CPU_KERNEL_VARIANTS=avx2,portable builds only those.

The DSA kernels' package `sgl-kernel-npu/` (not on PyPI) is optional and installed separately
(`make setup` does): without it SGLang runs, merges partial attentions in torch, and the `dsa`
attention backend refuses to start, naming it. So is the `pd` extra (`make setup-pd`): without it
a PD server refuses to start, naming the command that adds it.
"""

import importlib.util
import os
import sys

from setuptools import find_packages, setup

HERE = os.path.dirname(os.path.abspath(__file__))
KERNEL_DIR = os.path.join("python", "sglang", "srt", "kernels", "cpu")

INSTALL_REQUIRES = [
    # CPU build of torch lies on the local disk of our machines; accelerator users install
    # their own torch (CUDA / torch_npu) first and then `pip install -e . --no-deps` or keep it.
    "torch==2.13.0",
    "numpy",
    "safetensors",
    "tokenizers",
    "transformers",
    # model ids in --model-path: the local HF cache, downloads (model_loader/hf_resolve.py)
    "huggingface_hub",
    "gguf",
    "jinja2",
    "pyzmq",
    "fastapi",
    "uvicorn",
    "pydantic>=2",
    "aiohttp",
    "requests",
    "tqdm",
    "prometheus_client",
    # structured outputs: json_schema / regex / ebnf / structural_tag (constrained/, CPU wheels)
    "xgrammar==0.2.8",
    # compiles the CPU kernels' objects in parallel at install time (torch's BuildExtension)
    "ninja",
]


def _load_isa():
    """kernels/cpu/isa.py by path (the package itself is not importable before it is installed;
    sgl-kernel-npu/setup.py loads the same file)."""
    spec = importlib.util.spec_from_file_location("_sglang_cpu_isa", os.path.join(HERE, KERNEL_DIR, "isa.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # (its dataclasses look their module up)
    spec.loader.exec_module(module)
    return module


def _warn(msg):
    print(f"sglang setup: {msg}", file=sys.stderr)


def cpu_kernel_build():
    """(ext_modules, cmdclass) for the CPU kernels, or ([], {}) where they cannot be built here."""
    if os.environ.get("SGLANG_BUILD_CPU_KERNELS", "1").strip().lower() in ("0", "false", "no", "off"):
        return [], {}
    try:
        from torch.utils.cpp_extension import BuildExtension, CppExtension
    except ImportError:
        _warn(
            "torch is not importable here, so the CPU kernels are not built (the engine uses its torch code); "
            "install torch first and run pip with --no-build-isolation to build them"
        )
        return [], {}
    isa = _load_isa()
    tag = isa.source_tag(os.path.join(HERE, KERNEL_DIR, "csrc"))
    exts = [
        CppExtension(
            name=v.module,
            sources=[os.path.join(KERNEL_DIR, "csrc", s) for s in v.sources],
            extra_compile_args=list(isa.COMMON_CFLAGS + v.cflags + v.defines(tag)),
            extra_link_args=list(isa.COMMON_LDFLAGS),
            optional=True,  # a variant that does not compile is left out with a warning
        )
        for v in isa.selected_variants(os.environ.get("SGLANG_CPU_KERNEL_VARIANTS"))
    ]

    class BuildKernels(BuildExtension):
        """Each variant's objects in a build directory of its own (the variants compile the same
        sources with different flags), and a variant that fails to compile is skipped, not fatal."""

        def build_extensions(self):
            # Python's own CFLAGS (-g, -fwrapv, -Wall ...) are not ours: debug info and wrapping
            # signed overflow only slow the build and the loops; the kernels' flags are in isa.py
            drop = {"-g", "-fwrapv", "-Wall", "-Wsign-compare"}
            self.compiler.compiler_so = [a for a in self.compiler.compiler_so if a not in drop]
            super().build_extensions()

        def build_extension(self, ext):
            base = self.build_temp
            self.build_temp = os.path.join(base, ext.name.rpartition(".")[2])
            try:
                super().build_extension(ext)
            except Exception as exc:  # noqa: BLE001 - compiler missing or too old for the flags
                if not ext.optional:
                    raise
                _warn(
                    f"CPU kernel variant {ext.name} not built ({type(exc).__name__}: {exc}); "
                    "CPUs that would use it fall back to a lesser variant or the torch code"
                )
            finally:
                self.build_temp = base

    return exts, {"build_ext": BuildKernels.with_options(use_ninja=True)}


EXT_MODULES, CMDCLASS = cpu_kernel_build()

setup(
    name="sglang",
    version="0.1.0",
    description="Clean-room SGLang-compatible serving engine with PP x CP event loops",
    package_dir={"": "python"},
    packages=find_packages("python"),
    package_data={"sglang": ["test/assets/*/*", "srt/kernels/cpu/csrc/*.cpp", "srt/kernels/cpu/csrc/*.h"]},
    include_package_data=True,
    python_requires=">=3.10",
    install_requires=INSTALL_REQUIRES,
    extras_require={
        "test": [
            "pytest",
            "pytest-xdist",
            "ruff==0.17.6",
            "openai",
            "httpx",
            "prometheus_client",
            "matplotlib",
        ],
        # PD disaggregation, optional: the KV transfer engine (non-CUDA build; CUDA machines may install
        # mooncake-transfer-engine instead; it loads the system library libibverbs.so.1) and the
        # upstream router in front of prefill + decode. `make setup` adds it where libibverbs is there.
        "pd": ["mooncake-transfer-engine-non-cuda", "sglang-router"],
        "default-model": [],
    },
    ext_modules=EXT_MODULES,
    cmdclass=CMDCLASS,
)
