"""sgl-kernel-npu: the DSA ops (lightning indexer, sparse flash attention, LSE merge) with a torch
reference, Triton kernels, a torch_npu mapping and fused CPU kernels.

The CPU kernels are compiled here, at install time, with torch's C++ extension tooling: one
binding (csrc/cpu/dsa_ops.cpp) and one translation unit per instruction set (portable, AVX2 +
FMA, AVX2 + FMA + AVX-VNNI, AVX-512, AVX-512 + VNNI, AVX-512 + BF16 + VNNI), each built for its own target whatever the compiler's default, and picked at run
time from the CPU's flags. Install into the environment that holds torch, without build
isolation (the extension is built against that torch):

    pip install --no-build-isolation -e ./sgl-kernel-npu

SGL_KERNEL_NPU_SKIP_CPU_BUILD=1 installs the Python package alone (the ops then fall back to the
torch reference on CPU).
"""

import os
import platform

from setuptools import find_packages, setup

ROOT = os.path.dirname(os.path.abspath(__file__))
CSRC = os.path.join("csrc", "cpu")


def ext_modules():
    if os.environ.get("SGL_KERNEL_NPU_SKIP_CPU_BUILD") == "1":
        return [], {}
    from torch.utils.cpp_extension import BuildExtension, CppExtension

    sources = [os.path.join(CSRC, "dsa_ops.cpp"), os.path.join(CSRC, "dsa_isa_portable.cpp")]
    if platform.machine().lower() in ("x86_64", "amd64"):
        sources += [os.path.join(CSRC, f"dsa_isa_{isa}.cpp") for isa in ("avx2", "avx2vnni", "avx512", "avx512vnni", "avx512bf16")]
    ext = CppExtension(
        "sgl_kernel_npu._cpu_ops",
        sources,
        include_dirs=[os.path.join(ROOT, CSRC)],
        depends=[os.path.join(CSRC, h) for h in ("dsa_args.h", "dsa_isa_entry.h", "dsa_kernels_impl.h", "dsa_vec_avx512.h")],  # rebuild when they change
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
