"""Installs the `sglang` package from python/ (clean-room SGLang-compatible engine)."""
from setuptools import find_packages, setup

INSTALL_REQUIRES = [
    # CPU build of torch lies on the local disk of our machines; accelerator users install
    # their own torch (CUDA / torch_npu) first and then `pip install -e . --no-deps` or keep it.
    "torch==2.13.0",
    "numpy",
    "safetensors",
    "tokenizers",
    "transformers",
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
    # builds the fused CPU kernels (python/sglang/srt/kernels/cpu) with the host compiler
    "ninja",
]

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
        "test": ["pytest", "openai", "httpx", "prometheus_client", "matplotlib"],
        # PD disaggregation: the KV transfer engine (non-CUDA build; CUDA machines may install
        # mooncake-transfer-engine instead) and the upstream router in front of prefill + decode
        "pd": ["mooncake-transfer-engine-non-cuda", "sglang-router"],
        "default-model": [],
    },
)
