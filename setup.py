"""Packaging for keras-yolo3: ``pip install .`` or ``pip install -e .[test]``."""

import re

from setuptools import find_packages, setup

# The version has one home, yolo3.__version__; read here without importing the package.
VERSION = re.search(r'^__version__ = "(.+)"$', open("yolo3/__init__.py").read(), re.M).group(1)

TENSORFLOW = ">=2.21,<2.22"
MLFLOW_CLIENT = "mlflow-skinny>=3.17.2,<3.18"
EXPORT = ["onnx==1.23.2", "onnxruntime==1.32.0", "tf2onnx==1.17.0", "ai-edge-litert==2.3.0"]
# The documentation site (mkdocs.yml, docs/): MkDocs because its sources are Markdown like the
# README, mkdocstrings renders the API pages from the docstrings, and one `mkdocs build
# --strict` checks every page and link; matplotlib draws the benchmark plots (docs/plots.py).
DOCS = [
    "mkdocs>=1.6.1,<2",
    "mkdocs-material>=9.5,<10",
    "mkdocstrings>=1.0,<2",
    "mkdocstrings-python>=2.0,<3",
    "matplotlib>=3.8,<4",
]

setup(
    name="keras-yolo3",
    version=VERSION,
    description="YOLOv3 and tiny-YOLOv3 on Keras 3 and TensorFlow, for training on many GPUs",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    # The callbacks live in the repository's top-level callbacks/ folder and install inside
    # the library as yolo3.callbacks, so that the distribution adds one top-level name; the
    # shipped anchors and class names (model_data/) likewise, as data of yolo3.model_data,
    # where yolo3.model.resources.model_data_file finds them outside a checkout.
    packages=[*find_packages(include=["yolo3", "yolo3.*"]), "yolo3.callbacks", "yolo3.model_data"],
    package_dir={"yolo3.callbacks": "callbacks", "yolo3.model_data": "model_data"},
    package_data={"yolo3.model_data": ["*.txt"]},
    entry_points={"console_scripts": ["yolo3 = yolo3.commands:main"]},
    py_modules=[],
    install_requires=[
        f"tensorflow{TENSORFLOW}",
        # yolo3/distributed/keras_mwms.py patches Keras's multi-worker path and runs only on the
        # versions it was checked against (TESTED_KERAS_VERSIONS): install exactly those.
        "keras==3.15.1",
        "numpy>=1.26",
        "pillow>=10",
        "h5py>=3.10",
        "pycocotools>=2.0",
        "tqdm>=4.60",
        # Ultralytics data.yaml files (yolo3 preprocess --data): YAML's anchors, flow lists
        # and quoting are more than a hand-written reader should guess at.
        "pyyaml>=6",
        # tf.summary writes TensorBoard logs only with it installed (TF 2.21 no longer pulls it in).
        "tensorboard>=2.21,<2.22",
    ],
    extras_require={
        # GPUs: the same TensorFlow with NVIDIA's CUDA and cuDNN wheels beside it (Linux
        # x86-64; the NVIDIA driver is installed apart). Without them TensorFlow sees no GPU.
        "gpu": [f"tensorflow[and-cuda]{TENSORFLOW}"],
        # tools/export.py: ONNX through tf2onnx, run by onnxruntime; TFLite files are written
        # by TensorFlow's own converter and run by LiteRT (ai-edge-litert, which TensorFlow's
        # deprecated tf.lite.Interpreter points to). Pinned to the versions tested together.
        "export": EXPORT,
        # OpenCV reads videos in tools/detect.py and is the independent Darknet
        # implementation the conversion tests compare against. 5.x dropped the Darknet reader.
        "video": ["opencv-python-headless>=4.10,<5"],
        "docs": DOCS,
        # yolo3 train --mlflow and yolo3 evaluate --mlflow (callbacks/mlflow_tracking.py): the
        # client alone. The whole package (the server) pulls in scikit-learn, pandas and SciPy,
        # which `import tensorflow` then imports too, 0.6 s in every process; a tracking
        # server runs elsewhere (the tests start one from .venv-mlflow, which .ci/run makes).
        # 3.17 installs beside TensorFlow 2.21 with its protobuf and NumPy kept (3.18.0's
        # client package is not on the index).
        "mlflow": [MLFLOW_CLIENT],
        # nbclient runs examples/*.ipynb in tests/test_notebook.py on an ipykernel kernel.
        "test": [
            "pytest>=8",
            # The suite runs on two processes (-n 2 --dist loadfile): its multi-process and
            # tracing-bound tests leave a core idle much of the time (1.5x measured on 2 cores).
            "pytest-xdist>=3.6,<4",
            "opencv-python-headless>=4.10,<5",
            "ruff>=0.6",
            "nbclient>=0.10,<0.12",
            "nbformat>=5.10,<6",
            "ipykernel>=6.29,<8",
            # tests/test_formats.py: an independent reader of YOLO label files and VOC XML
            # that the project's own readers (yolo3.data.formats) are checked against.
            "globox>=2.9,<3",
            # The fuzz tests of the readers of files from elsewhere (record shards, annotation
            # lines, dataset formats): generated hostile inputs, shrunk to the smallest that fails.
            "hypothesis>=6.100,<7",
            *EXPORT,
            MLFLOW_CLIENT,  # tests/test_mlflow.py reads runs back with MLflow's client
            # tests/test_docs.py builds the site.
            *DOCS,
        ],
    },
)
