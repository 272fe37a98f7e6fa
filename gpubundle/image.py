"""What the lent GPU machine's image holds (read off such a machine, 2026-11-17 and 2026-11-26):
the facts a pack for it is resolved against. Standard library only.

- ``PYTHON``: its interpreter's version; ``PLATFORMS``: the wheel platform tags pip may take for
  it (x86-64; glibc up to 2.35: its Python 3.12.3 is Ubuntu 24.04's, glibc 2.39, and vLLM's
  dependencies include manylinux_2_31 wheels, e.g. llguidance).
- ``PACKAGES``: the distributions the image ships (names as pip normalises them). A pack carries
  none of them; where a carried package needs a version of one the image may not have, the GPU
  side checks it there first (``vllm_env.check_requirements``) and installs a carried
  replacement only if the check fails.
- ``KNOWN``: the versions seen there (the rest were not read); ``make gpu-image-venv`` builds a
  venv of this shape here, for resolving vLLM's needs and for the self-test.
- ``SESSION``: image packages the session runs with (pytest), in the image-shaped venv too.
- ``NEVER_CARRY``: image packages a carried package pins differently but that must stay the
  image's: the torch stack (replacing it is ~2 GB), and numpy with numba/llvmlite (vllm 0.26 pins
  numba 0.65, which asks numpy < 2.5; with the image's numpy 2.5.2 every import ran, and numba
  serves only n-gram speculative decoding).
"""

from __future__ import annotations

import re

PYTHON = "3.12"
PLATFORMS = ["manylinux_2_35_x86_64", "manylinux_2_34_x86_64", "manylinux_2_31_x86_64", "manylinux_2_28_x86_64",
             "manylinux_2_27_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64", "linux_x86_64"]

KNOWN = {"torch": "2.11.0", "torchvision": "0.26.0", "torchaudio": "2.11.0", "triton": "3.6.0",
         "transformers": "5.17.0", "numpy": "2.5.2", "tokenizers": "0.23.2", "huggingface-hub": "1.33.0",
         "safetensors": "0.8.0", "sentencepiece": "0.2.2", "tiktoken": "0.14.0", "accelerate": "1.15.0"}

PACKAGES = frozenset("""
absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build certifi
charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core cuda-pathfinder
cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock flatbuffers flax fonttools
formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize hypothesis idna
imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib kiwisolver
lazy-loader lightning lightning-utilities linear-operator lineax llvmlite lxml markdown markdown-it-py markupsafe
matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind narwhals
networkx ninja numba numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime
nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13
nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime onnxscript
opencv-python-headless optax opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging pandas pathspec patsy
peft pillow pip pluggy portalocker prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments
pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist python-dateutil
pytorch-lightning pyyaml regex requests rich sacrebleu safetensors scikit-build-core scikit-image scikit-learn scipy
seaborn sentencepiece sentence-transformers setuptools shellingham simplejson six sortedcontainers statsmodels sympy
tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm tokenizers toolz torch
torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm transformers treescope triton typer
typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel wrapt xarray xxhash yarl zipp
""".split())

NEVER_CARRY = frozenset({"torch", "torchvision", "torchaudio", "triton", "numpy", "numba", "llvmlite"})

# image packages the session itself runs with there (the test stages' pytest), beside what vLLM's install touches
SESSION = ("pytest",)


def normalize(name: str) -> str:
    """A distribution name as pip compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def in_image(name: str) -> bool:
    return normalize(name) in PACKAGES
