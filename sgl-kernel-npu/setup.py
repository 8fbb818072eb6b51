"""sgl-kernel-npu: the DSA ops (lightning indexer, sparse flash attention, LSE merge) with a torch
reference, Triton kernels, a torch_npu mapping and fused CPU kernels.

The CPU kernels are compiled here, at install time, with torch's C++ extension tooling: one
binding (csrc/cpu/dsa_ops.cpp) and one translation unit per instruction set of SGLang's one ISA
vocabulary (python/sglang/srt/kernels/cpu/isa.py, loaded here by path: avx512bf16, avx512vnni,
avx512, avx2vnni, avx2, portable), each built for its own target whatever the compiler's default;
at run time the selector of that same file picks one (SGLANG_CPU_ISA, or the best the CPU runs).
Install into the environment that holds torch, without build isolation (the extension is built
against that torch):

    pip install --no-build-isolation -e ./sgl-kernel-npu

SGL_KERNEL_NPU_SKIP_CPU_BUILD=1 installs the Python package alone (the ops then fall back to the
torch reference on CPU).
"""

import importlib.util
import os
import sys

from setuptools import find_packages, setup

ROOT = os.path.dirname(os.path.abspath(__file__))
CSRC = os.path.join("csrc", "cpu")
# SGLang's one ISA vocabulary and selector (standard library only), next to this package in the checkout
ISA_FILE = os.path.join(ROOT, "..", "python", "sglang", "srt", "kernels", "cpu", "isa.py")


def load_isa():
    """SGLang's kernels/cpu/isa.py by path (nothing is installed yet when this runs)."""
    if not os.path.isfile(ISA_FILE):
        raise SystemExit(
            f"sgl-kernel-npu builds inside the SGLang checkout: {ISA_FILE} (the ISA vocabulary) is missing"
        )
    spec = importlib.util.spec_from_file_location("_sglang_cpu_isa", ISA_FILE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # (its dataclasses look their module up)
    spec.loader.exec_module(module)
    return module


def isa_sources():
    """dsa_isa_<name>.cpp for every ISA of this architecture's vocabulary (each must exist)."""
    names = list(load_isa().isas())
    files = [os.path.join(CSRC, f"dsa_isa_{name}.cpp") for name in names]
    missing = [f for f in files if not os.path.isfile(os.path.join(ROOT, f))]
    if missing:
        raise SystemExit(
            f"the ISA vocabulary names {names}, but these translation units are missing: {missing}"
        )
    return files


def ext_modules():
    if os.environ.get("SGL_KERNEL_NPU_SKIP_CPU_BUILD") == "1":
        return [], {}
    from torch.utils.cpp_extension import BuildExtension, CppExtension

    sources = [os.path.join(CSRC, "dsa_ops.cpp")] + isa_sources()
    ext = CppExtension(
        "sgl_kernel_npu._cpu_ops",
        sources,
        include_dirs=[os.path.join(ROOT, CSRC)],
        depends=[
            os.path.join(CSRC, h)
            for h in ("dsa_args.h", "dsa_fp8.h", "dsa_isa_entry.h", "dsa_kernels_impl.h", "dsa_vec_avx512.h")
        ],  # rebuild when they change
        extra_compile_args=["-O3", "-std=c++17", "-fno-math-errno"],
    )
    return [ext], {"build_ext": BuildExtension.with_options(use_ninja=False)}


modules, cmdclass = ext_modules()

setup(
    name="sgl-kernel-npu",
    version="0.1.0",
    description="DSA kernels for SGLang: lightning indexer, sparse flash attention, LSE merge",
    package_dir={"": "python"},
    packages=find_packages("python"),
    ext_modules=modules,
    cmdclass=cmdclass,
    python_requires=">=3.9",
    install_requires=["torch"],
    extras_require={"test": ["pytest", "triton"]},
)
