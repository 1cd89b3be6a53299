"""Run a Cerebras Model Zoo program unmodified on cstream: train, resume and evaluate, on CPU and CSX.

Given an extracted Model Zoo release (its code is only read and run, never copied), this writes
the program's data offline (tools/modelzoo_writers.py: MNIST in the idx-ubyte format from
``examples/digits.npz``; GPT-2 token files in the Model Zoo's HDF5 format; the CSV, TSV and HDF5
files of the BERT families' and ESM-2's data processors with their vocabulary and label files;
T5's and the Transformer's token text files; image folders, DiT's latents and UNet's
Severstal images with their run-length-encoded masks; LLaVA's and
multimodal_simple's token files and the images they name), a copy of the program's shipped
configuration with the steps, data folder and precision set, and then runs the program's own
``run.py`` with its usual command line, each backend in its own process:

1. ``--mode train`` for ``--steps`` steps, a checkpoint every ``--steps // 3`` steps;
2. the same training resumed from the first checkpoint in a fresh model folder (the Model Zoo
   flow autoloads the latest checkpoint it finds there);
3. ``--mode eval`` of the last checkpoint.

It compares the per-step losses of CSX against CPU and of each resumed run against its
uninterrupted run, writes the figures to ``--out`` (JSON) and prints one line per comparison
(``--table FILE...`` prints the table of docs/modelzoo.md from such files)::

    PYTHONPATH=$PWD python tools/modelzoo_trials.py --release /tmp/mz/Release_2.0.2 \\
        --program fc_mnist --precision fp32 --out benchmarks/results/modelzoo_fc_mnist_2.0.2.json

``--pythonpath`` adds folders the Model Zoo's own imports need (torchvision for MNIST, the
registry's dependencies in Release 2.2).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import yaml

from tools.modelzoo_writers import (
    ENCODER_MSL, ESM2_SPECIAL, LATENT, LATENT_FOLDERS, MAX_CLS_TOKENS, MAX_PREDICTIONS,
    SEQ2SEQ_MSL, UNET_IMAGE, VISION_CLASSES, write_bert_data, write_dpr_hdf5,
    write_gpt_hdf5, write_llava_hdf5, write_mnist, write_multimodal_simple_hdf5,
    write_seq2seq_data, write_severstal, write_vision_data)

REPO = Path(__file__).resolve().parents[1]
LOSS = re.compile(r"Step=(\d+), Loss=([-\d.einfa]+)")
EVAL_LOSS = re.compile(r"Avg Eval Loss: ([-\d.einfa]+)")
METRIC = re.compile(r"Metric: (\S+) = ([-\d.einfa]+)")
PRECISIONS = {
    # name: (model.mixed_precision, model.use_bfloat16)
    "fp32": (False, False),
    "mixed-bf16": (True, True),
    "mixed-fp16": (True, False),
}


GPT_FAMILIES_2_2 = {  # family: the smallest shipped configuration of its folder
    "gpt2": "params_gpt2_small.yaml", "gpt3": "params_gpt3_111m.yaml",
    "gptj": "params_gpt_neox_small.yaml", "llama": "params_llama2_7b.yaml",
    "mistral": "params_mistral_7B.yaml", "falcon": "params_falcon_7b.yaml",
    "bloom": "params_bloom_7b.yaml", "mpt": "params_mpt_7B.yaml",
    "starcoder": "params_starcoder_15b.yaml", "santacoder": "params_santacoder_1b.yaml",
    "btlm": "params_btlm_2p7b_2k.yaml", "jais": "params_jais_30b.yaml",
}
"""Release 2.2's decoder language models: each reads the GPT HDF5 token files."""

DECODER_FAMILIES_2_2 = {**GPT_FAMILIES_2_2, "dpo": "params_zephyr_7b_dpo.yaml"}
"""Every Release 2.2 family built on a decoder (DPO trains a Mistral on chosen/rejected pairs)."""

ENCODER_FAMILIES_2_2 = {  # family: (its folder under models/nlp/, the shipped configuration)
    "bert": ("bert", "bert_base_MSL128.yaml"),
    "bert_classifier": ("bert/classifier", "bert_base_classifier_sst2.yaml"),
    "bert_token_classifier": ("bert/token_classifier", "bert_base_ner_bc5cdr_chem.yaml"),
    "bert_extractive_summarization": ("bert/extractive_summarization",
                                      "bert_base_summarization.yaml"),
    "esm2": ("esm2", "params_esm2_t33_650M_UR50D.yaml"),
}
"""Release 2.2's encoder families: BERT pretraining and its fine-tuning heads, and ESM-2 (a
BERT of protein tokens); each reads the CSV (or TSV) files its data processor names."""

DPR_2_2 = ("dpr", "params_dpr_base_nq.yaml")
"""Release 2.2's DPR: two BERT encoders (questions, contexts) on DPRHDF5DataProcessor's
files."""

SEQ2SEQ_FAMILIES_2_2 = {"t5": ("t5", "t5_small.yaml"),
                        "transformer": ("transformer", "transformer_base.yaml")}
"""Release 2.2's encoder-decoder families: their loaders name ``src_``/``tgt_`` folders,
vocabularies and sequence lengths."""

FAMILIES_2_2 = [*GPT_FAMILIES_2_2, "bert", "bert_classifier", "bert_token_classifier",
                "bert_extractive_summarization", "t5", "transformer", "esm2", "dpr", "dpo",
                "dit", "llava", "vision_transformer", "fc_mnist"]
"""Release 2.2's 25 model families (bert counted with each of its fine-tuning heads)."""

LEGACY_CONFIGS = {  # family: (its folder under modelzoo/, its smallest shipped configuration)
    "fc_mnist": ("fc_mnist/pytorch", "params.yaml"),
    **{f: (f"transformers/pytorch/{f}", c) for f, c in {
        **GPT_FAMILIES_2_2, "mistral": "params_mistral_7B.yaml",
        "t5": "t5_small.yaml", "transformer": "transformer_base.yaml",
        "bert": "bert_base_MSL128.yaml"}.items()},
    "bert_classifier": ("transformers/pytorch/bert/fine_tuning/classifier",
                        "bert_base_classifier_sst2.yaml"),
    "bert_token_classifier": ("transformers/pytorch/bert/fine_tuning/token_classifier",
                              "bert_base_ner_bc5cdr_chem.yaml"),
    "bert_extractive_summarization": ("transformers/pytorch/bert/fine_tuning/"
                                      "extractive_summarization", "bert_base_summarization.yaml"),
    "dit": ("vision/pytorch/dit", "params_dit_small_patchsize_2x2.yaml"),
    "unet": ("vision/pytorch/unet", "params_severstal_binary.yaml"),
}
"""Release 2.0/2.1 (``modelzoo/`` at the checkout's top, no config classes) families: the
same data processors as Release 2.2's, in the older folders; bert's fine-tuning heads under
``bert/fine_tuning/``. A release has the families of this list whose folder has a ``run.py``
(and layers_api_demo, which does not build: NOT_RUN_LEGACY)."""


def is_legacy_release(release: Path) -> bool:
    """Release 2.0/2.1: the package folder is ``modelzoo/`` at the top of the checkout."""
    return code_root(release)[0].name != "src"


def families_legacy(release: Path) -> list[str]:
    """The model families of a Release 2.0/2.1 checkout: the folders with a ``run.py``, named
    without the ``transformers``/``vision``/``pytorch``/``fine_tuning`` levels (bert's heads as
    ``bert_<head>``)."""
    code = code_root(release)[1]
    skip = {"transformers", "vision", "pytorch", "fine_tuning"}
    return sorted("_".join(part for part in p.parent.relative_to(code).parts if part not in skip)
                  for p in code.glob("**/run.py"))


TRAINER_CONFIGS = {  # family: (its folder under models/, the shipped configuration derived from)
    "fc_mnist": ("vision/fc_mnist", "params_cszoov2.yaml"),
    "gpt2": ("nlp/gpt2", "../../gpt3/configs/params_gpt3_xl.yaml"),
    "gpt3": ("nlp/gpt3", "params_gpt3_xl.yaml"),
    "gptj": ("nlp/gptj", "params_gptj_6B.yaml"),
    "llama": ("nlp/llama", "params_llama2_7b.yaml"),
    "mistral": ("nlp/mistral", "params_mistral_12b.yaml"),
    "mixtral": ("nlp/mixtral", "params_moe_111M_base.yaml"),
    "falcon": ("nlp/falcon", "params_falcon_7b.yaml"),
    "bloom": ("nlp/bloom", "params_bloom_7b.yaml"),
    "btlm": ("nlp/btlm", "params_btlm_2p7b_2k.yaml"),
    "jais": ("nlp/jais", "params_jais_13b.yaml"),
    "gemma2": ("nlp/gemma2", "params_gemma2_9b_msl8k.yaml"),
    "santacoder": ("nlp/santacoder", "params_santacoder_1b.yaml"),
    "starcoder": ("nlp/starcoder", "params_starcoder_15b.yaml"),
    "dpo": ("nlp/dpo", "params_zephyr_7b_dpo.yaml"),
    "bert": ("nlp/bert", "bert_base_MSL128.yaml"),
    "bert_classifier": ("nlp/bert/classifier", "bert_base_classifier_sst2.yaml"),
    "bert_token_classifier": ("nlp/bert/token_classifier", "bert_base_ner_bc5cdr_chem.yaml"),
    "bert_extractive_summarization": ("nlp/bert/extractive_summarization",
                                      "bert_base_summarization.yaml"),
    "esm2": ("nlp/esm2", "params_esm2_t12_35M_UR50D.yaml"),
    "t5": ("nlp/t5", "t5_3B.yaml"),
    "transformer": ("nlp/transformer", "transformer_base.yaml"),
    "dpr": ("nlp/dpr", "params_dpr_base_nq.yaml"),
}
"""Release 2.3+ (``Trainer``) families this tool writes data for. gpt2's folder ships no
configuration in 2.10: its trial is gpt3's configuration with the model named gpt2 (the two
config classes share their fields)."""


def is_trainer_release(release: Path) -> bool:
    """Release 2.3 on: programs run through ``cerebras.modelzoo.trainer`` and read a
    ``trainer:`` configuration."""
    return (code_root(release)[1] / "trainer" / "trainer.py").is_file()


def code_root(release: Path) -> tuple[Path, Path]:
    """(the folder to put on PYTHONPATH, the Model Zoo's package folder) of a checkout."""
    if (release / "src" / "cerebras" / "modelzoo").is_dir():
        return release / "src", release / "src" / "cerebras" / "modelzoo"
    return release, release / "modelzoo"


def program_paths(release: Path, program: str) -> tuple[Path, Path, Path]:
    """(run.py, shipped params.yaml, the folder to put on PYTHONPATH) of ``program``."""
    root, code = code_root(release)
    if is_trainer_release(release):
        folder, shipped = TRAINER_CONFIGS[program]
        folder = code / "models" / folder
        return folder / "run.py", (folder / "configs" / shipped).resolve(), root
    if is_legacy_release(release):
        folder, shipped = LEGACY_CONFIGS[program]
        folder = code / folder
    elif program == "fc_mnist":
        folder, shipped = code / "fc_mnist" / "pytorch", "params.yaml"
    elif program in VISION_FAMILIES_2_2:
        folder, shipped = code / "models" / "vision" / program, VISION_FAMILIES_2_2[program]
    elif program in MULTIMODAL_FAMILIES_2_2:
        folder, shipped = code / "models" / "multimodal" / program, \
            MULTIMODAL_FAMILIES_2_2[program]
    elif program in ENCODER_FAMILIES_2_2 or program in SEQ2SEQ_FAMILIES_2_2 or program == "dpr":
        folder, shipped = {**ENCODER_FAMILIES_2_2, **SEQ2SEQ_FAMILIES_2_2, "dpr": DPR_2_2}[program]
        folder = code / "models" / "nlp" / folder
    else:
        folder, shipped = code / "models" / "nlp" / program, DECODER_FAMILIES_2_2[program]
    return folder / "run.py", folder / "configs" / shipped, root




def encoder_processors(written: dict) -> list[str]:
    """The data processors a configuration (either layout) names for its loaders."""
    if "trainer" in written:
        t = written["trainer"]
        loaders = [t["fit"]["train_dataloader"], t["validate"]["val_dataloader"]]
    else:
        loaders = [written["train_input"], written["eval_input"]]
    return sorted({loader["data_processor"] for loader in loaders})


FINE_TUNING_DROPOUTS = ("dropout_rate", "attention_dropout_rate", "embedding_dropout_rate")
"""Dropout rates of the BERT fine-tuning heads' configuration classes that default to 0.1 when
the shipped configuration leaves them out (the pretraining models take the embeddings' rate
from ``dropout_rate``)."""


def encoder_files(program: str, model: dict, loaders: list, data: Path) -> None:
    """Point an encoder family's model and loaders at the files :func:`write_bert_data`
    writes: the data folder, ``vocab.txt`` and ``label2id.json`` wherever the configuration
    names a vocabulary or label file, the sequence length ENCODER_MSL (the HDF5 processors
    take theirs from the files), MAX_CLS_TOKENS sentences; a fine-tuning head's
    FINE_TUNING_DROPOUTS set to 0, as :func:`tiny_decoder` sets the rates a configuration
    names."""
    if program.startswith("bert_"):
        model.update(dict.fromkeys(FINE_TUNING_DROPOUTS, 0.0))
    for section in (model, *loaders):
        if "vocab_file" in section:
            section["vocab_file"] = str(data / "vocab.txt")
        if "label_vocab_file" in section:
            section["label_vocab_file"] = str(data / "label2id.json")
    for loader in loaders:
        if "HDF5" in loader["data_processor"]:
            loader.pop("max_sequence_length", None)
        elif "max_sequence_length" in loader:
            loader["max_sequence_length"] = ENCODER_MSL
        if "max_cls_tokens" in loader:
            loader["max_cls_tokens"] = MAX_CLS_TOKENS
        if "max_predictions_per_seq" in loader:
            loader["max_predictions_per_seq"] = MAX_PREDICTIONS




TINY_SEQ2SEQ = {"d_model": 64, "d_kv": 16, "num_heads": 4, "d_ff": 256,
                "encoder_num_hidden_layers": 2, "decoder_num_hidden_layers": 2}
"""An encoder-decoder as small as TINY_DECODER: 2 layers each side, 64 wide, 4 heads of 16."""





def tiny_seq2seq(program: str, model: dict, loaders: list, data: Path,
                 vocab: int = 512) -> None:
    """Shrink an encoder-decoder configuration in place (TINY_SEQ2SEQ, no dropout, the
    vocabulary ``vocab`` with T5's sentinel ``extra_ids`` in it) and point its loaders at
    :func:`write_seq2seq_data`'s files, at SEQ2SEQ_MSL's lengths."""
    model.update(TINY_SEQ2SEQ)
    extra = int(model.get("extra_ids") or 0)
    for key in ("src_vocab_size", "tgt_vocab_size"):
        if key in model:
            model[key] = vocab - extra
    for key, value in list(model.items()):
        if "dropout" in key and isinstance(value, (int, float)) and not isinstance(value, bool):
            model[key] = 0.0
    src, tgt = SEQ2SEQ_MSL[program]
    for key, length in (("src_max_position_embeddings", src),
                        ("tgt_max_position_embeddings", tgt)):
        if key in model:
            model[key] = length
    for loader in loaders:
        loader.pop("data_dir", None)
        for key in ("src_data_dir", "tgt_data_dir"):
            if key in loader:
                loader[key] = str(data)
        for key in ("src_vocab_file", "tgt_vocab_file"):
            if key in loader:
                loader[key] = str(data / "vocab.txt")
        loader.update(src_max_sequence_length=src, tgt_max_sequence_length=tgt)
        loader.pop("shuffle_buffer", None)


def half_flag(release: Path) -> str:
    """The model key a Release 2.0-2.2 checkout picks its half dtype with: ``fp16_type`` from
    Release 2.1 on (its ``common/pytorch/half_dtype.py`` refuses ``use_bfloat16``),
    ``use_bfloat16`` in Release 2.0, whose code does not know ``fp16_type``."""
    code = code_root(release)[1]
    module = next((p for p in (code / "common" / "pytorch" / "half_dtype.py",
                               code / "common" / "half_dtype.py") if p.is_file()), None)
    if module is None or "fp16_type" in module.read_text():
        return "fp16_type"
    return "use_bfloat16"


def checkpoint_every(steps: int) -> int:
    """Steps between checkpoints: a third of the run (the resumed run starts at the first)."""
    return max(1, steps // 3)


def params_for(program: str, shipped: Path, data: Path, steps: int, precision: str,
               release_2_2: bool, half_key: str = "fp16_type") -> dict:
    """The shipped configuration with this trial's data, steps, precision and logging;
    ``half_key`` is the model key that picks the half dtype (:func:`half_flag`)."""
    params = yaml.safe_load(shipped.read_text())
    mixed, bf16 = PRECISIONS[precision]
    params["model"]["mixed_precision"] = mixed
    if half_key == "fp16_type":  # Release 2.1 on names the half dtype, refusing the old flag
        params["model"]["fp16_type"] = "bfloat16" if bf16 else "float16"
    else:
        params["model"]["use_bfloat16"] = bf16
    run = params["runconfig"]
    run.update(max_steps=steps, log_steps=1, checkpoint_steps=checkpoint_every(steps), seed=1,
               save_initial_checkpoint=False)
    run.pop("eval_frequency", None)
    if "num_workers_per_csx" in run:  # one input worker: the CPU run's batches in its order
        run["num_workers_per_csx"] = 1
    # a fine-tuning configuration (DPO) loads only the model's weights from a checkpoint it
    # finds: the resumed trial loads everything, as a resumed run does
    run.pop("load_checkpoint_states", None)
    for key in ("train_input", "eval_input"):
        params[key]["data_dir"] = str(data)
        if program == "fc_mnist":  # its loader streams half images on CSX unless told not to
            params[key]["to_float16"] = mixed
    if program == "fc_mnist":
        run["steps_per_epoch"] = steps  # 2.0.x reads it; 1,500 images give 375 batches of 4
        run["eval_steps"] = 20
    elif program == "unet":
        params["optimizer"] = trial_optimizer(params["optimizer"], steps)
        loaders = [params["train_input"], params["eval_input"]]
        tiny_unet(params["model"], loaders)
        for loader in loaders:
            loader.update(batch_size=8, shuffle=False)
        run["eval_steps"] = 4
    else:
        if program in VISION_FAMILIES_2_2:
            tiny_vision(program, params["model"], [params["train_input"], params["eval_input"]],
                        steps)
        elif program in MULTIMODAL_FAMILIES_2_2:
            tiny_multimodal(program, params["model"],
                            [params["train_input"], params["eval_input"]], data)
        elif program == "dpr":
            for encoder in ("q_encoder", "ctx_encoder"):
                tiny_decoder(params["model"][encoder])
        elif program not in SEQ2SEQ_FAMILIES_2_2:
            tiny_decoder(params["model"])
        params["optimizer"] = trial_optimizer(params["optimizer"], steps)
        for key in ("train_input", "eval_input"):
            params[key].update(batch_size=8, shuffle=False,
                               num_workers=0 if release_2_2 else 1)
            if program not in ENCODER_FAMILIES_2_2:
                params[key].pop("max_sequence_length", None)  # "sample" files fix the length
            params[key].pop("micro_batch_size", None)  # the whole batch at once
        if program in ENCODER_FAMILIES_2_2:
            encoder_files(program, params["model"],
                          [params["train_input"], params["eval_input"]], data)
        if program in SEQ2SEQ_FAMILIES_2_2:
            tiny_seq2seq(program, params["model"],
                         [params["train_input"], params["eval_input"]], data)
        run["eval_steps"] = 4
    return params


TINY_UNET = {"encoder_filters": [8, 16], "decoder_filters": [8]}
"""A UNet of two encoder blocks and one decoder block (its images: UNET_IMAGE)."""


def tiny_unet(model: dict, loaders: list) -> None:
    """Shrink Release 2.0's UNet (Severstal, binary) in place: TINY_UNET's filters on
    ``UNET_IMAGE`` images, the loaders reading :func:`write_severstal`'s files in one process
    without the random flips of ``augment_data`` (they draw from Python's global generator)."""
    model.update(copy.deepcopy(TINY_UNET))
    for loader in loaders:
        loader.update(image_shape=[*UNET_IMAGE, 1], max_image_shape=list(UNET_IMAGE),
                      augment_data=False, num_workers=0, use_worker_cache=False,
                      use_fast_dataloader=False, persistent_workers=False,
                      train_test_split=0.6)  # of 100 images: 7 training batches, 5 to evaluate


TINY_DECODER = {"hidden_size": 64, "num_heads": 4, "num_hidden_layers": 2, "filter_size": 256,
                "vocab_size": 512, "max_position_embeddings": 64}
"""A decoder small enough for two cores; the token files are written for its vocabulary and
sequence length (64)."""


def tiny_decoder(model: dict) -> None:
    """Shrink a shipped decoder (or encoder) configuration in place, keeping its structure
    (position embedding, attention module, norms, nonlinearity, scaling): sizes from
    TINY_DECODER (a vocabulary smaller than its 512 kept), the
    rotary dimension the head size, a sliding window half the sequence, at most 2 key-value
    groups, and no dropout, so CPU and CSX draw nothing random."""
    vocab = model.get("vocab_size")
    model.update(TINY_DECODER)
    if isinstance(vocab, int) and vocab < TINY_DECODER["vocab_size"]:
        model["vocab_size"] = vocab  # ESM-2's 33 tokens
    head = TINY_DECODER["hidden_size"] // TINY_DECODER["num_heads"]
    if "rotary_dim" in model:
        model["rotary_dim"] = head
    if "attention_sliding_window_length" in model:
        model["attention_sliding_window_length"] = TINY_DECODER["max_position_embeddings"] // 2
    extra = model.get("extra_attention_params") or {}
    if "num_kv_groups" in extra:
        extra["num_kv_groups"] = min(2, extra["num_kv_groups"])
    for key, value in list(model.items()):
        if "dropout" in key and isinstance(value, (int, float)) and not isinstance(value, bool):
            model[key] = 0.0


TRIAL_PEAK_LR = 1e-2
"""The largest rate of a trial's schedule: large enough that a tiny model's loss moves by more
than one bfloat16 unit within the few steps run."""

CSX_ONLY_KEYS = ("max_gradient_norm", "max_gradient_value")
"""Optimizer keys Release 2.2's flow applies on CSX only: it creates its GradScaler, and clips
through it, only when the backend is CSX (GPU), so CPU never clips. The trials remove them to
compare the two devices on the same computation."""


def trial_optimizer(optimizer: dict, steps: int) -> dict:
    """The shipped optimizer section for a run of ``steps`` steps: each scheduler of the
    shipped schedule (warm-up, decay, ...) keeps its class and its share of the run
    (``total_iters`` the steps divided among the schedulers), its rates scaled so the largest
    is TRIAL_PEAK_LR; a constant rate becomes TRIAL_PEAK_LR; CSX_ONLY_KEYS are removed."""
    optimizer = {k: v for k, v in optimizer.items() if k not in CSX_ONLY_KEYS}
    rate = optimizer.get("learning_rate")
    if not isinstance(rate, (list, dict)):
        optimizer["learning_rate"] = TRIAL_PEAK_LR
        return optimizer
    specs = [dict(s) for s in (rate if isinstance(rate, list) else [rate])]
    rate_keys = [k for s in specs for k in s if "learning_rate" in k and isinstance(s[k], float)]
    peak = max([s[k] for s in specs for k in s if k in rate_keys] or [0.0])
    for s in specs:
        for k in list(s):
            if k in rate_keys and peak:
                s[k] = s[k] * TRIAL_PEAK_LR / peak
        if "total_iters" in s:
            s["total_iters"] = max(1, steps // len(specs))
    optimizer["learning_rate"] = specs if isinstance(rate, list) else specs[0]
    return optimizer


def trial_schedulers(schedulers: list, steps: int) -> list:
    """A Trainer configuration's ``schedulers:`` list for a run of ``steps`` steps, as
    :func:`trial_optimizer` does for Release 2.2: every scheduler (also inside a SequentialLR)
    keeps its class and its share of the run, its rates scaled so the largest is
    TRIAL_PEAK_LR."""
    leaves = []

    def walk(spec):
        for name, args in spec.items():
            if isinstance(args, dict) and isinstance(args.get("schedulers"), list):
                for inner in args["schedulers"]:
                    walk(inner)
            elif isinstance(args, dict):
                leaves.append(args)

    schedulers = copy.deepcopy(schedulers)
    for spec in schedulers:
        walk(spec)
    rates = [(a, k) for a in leaves for k, v in a.items()
             if "learning_rate" in k and isinstance(v, (int, float))]
    peak = max([a[k] for a, k in rates] or [0.0])
    for a, k in rates:
        a[k] = a[k] * TRIAL_PEAK_LR / peak if peak else TRIAL_PEAK_LR
    for a in leaves:
        if "total_iters" in a:
            a["total_iters"] = max(1, steps // len(leaves))
    return schedulers


CSX_PERFORMANCE_FLAGS = ("csx.performance.micro_batch_size",)
"""Flags of the ScopedTrainFlags/ScopedValidateFlags callbacks sized for the shipped batch (a
micro batch of 88 does not divide the trials' 8): removed, as Release 2.2's trials remove
``micro_batch_size``."""


def trainer_params_for(program: str, shipped: Path, data: Path, steps: int,
                       precision: str) -> dict:
    """A Release 2.3+ ``trainer:`` configuration from the shipped one: this trial's data,
    steps, precision, checkpoints and logging; decoders shrunk by :func:`tiny_decoder`.

    Mixed precision is on in every trial of these releases: their MixedPrecision callback
    turns it on for CSX whatever the configuration says, so CPU runs it too to compare the same
    computation. The loss scale is fixed at 1.0 (dynamic scaling runs on CSX only); gradient
    clipping, which the callback applies on both devices, is kept. The fit trains only: the
    evaluation is its own ``--mode eval`` run of the last checkpoint."""
    params = yaml.safe_load(shipped.read_text())
    trainer = params["trainer"]
    init, fit = trainer["init"], trainer["fit"]
    init.pop("model_dir", None)  # the command line's --model_dir
    init.pop("backend", None)  # the command line's CPU / CSX
    init["seed"] = 1
    init["loop"] = {"max_steps": steps, "eval_steps": 20 if program == "fc_mnist" else 4}
    # the initial weights too: the real package's trial trains from cstream's (see
    # real_package_runs), so the two train from the same weights
    init["checkpoint"] = {"steps": checkpoint_every(steps), "save_initial_checkpoint": True}
    init["logging"] = {"log_steps": 1}
    _, bf16 = PRECISIONS[precision]
    init["precision"] = {**{k: v for k, v in (init.get("precision") or {}).items()
                            if k in ("max_gradient_norm", "max_gradient_value")},
                         "enabled": True, "fp16_type": "bfloat16" if bf16 else "float16",
                         "loss_scaling_factor": 1.0}
    callbacks = []
    for callback in init.get("callbacks") or []:
        (name, args), = callback.items()
        if name == "LoadCheckpointStates":
            # a fine-tuning config loads only the weights of the checkpoint it starts from
            # (gemma2's `load_checkpoint_states: model`); the trial's resume loads all of it
            continue
        if name == "KeepNCheckpoints":
            # the multimodal configs keep the last 1 or 3: the trial reads the initial (the
            # real package's start), the first (the resume's) and the last (the evaluations')
            continue
        if name in ("ScopedTrainFlags", "ScopedValidateFlags"):
            args = {k: v for k, v in (args or {}).items() if k not in CSX_PERFORMANCE_FLAGS}
        callbacks.append({name: args})
    init["callbacks"] = callbacks
    model = init["model"]
    if program == "gpt2":
        model["name"] = "gpt2"
    loaders = [fit["train_dataloader"], fit.get("val_dataloader") or
               trainer.get("validate", {}).get("val_dataloader")]
    if loaders[1] is None:  # DINOv2's: evaluate on the training data, as its img518 config does
        loaders[1] = copy.deepcopy(loaders[0])
    if program == "dpr":
        for encoder in ("q_encoder", "ctx_encoder"):
            tiny_decoder(model[encoder])
    elif program not in ("fc_mnist", *VISION_CONFIGS, *SEQ2SEQ_FAMILIES_2_2,
                         *MULTIMODAL_CONFIGS):
        tiny_decoder(model.get("policy_model", model))  # DPO trains a decoder inside
    if program != "fc_mnist":
        init["schedulers"] = trial_schedulers(init.get("schedulers") or [], steps)
    for loader in loaders:
        loader["data_dir"] = str(data)
        if program == "fc_mnist":
            # no shuffle: its DataLoader shuffles with torch's global generator, whose state
            # at the first batch depends on what each package drew before
            loader.update(to_float16=True, shuffle=False)
        else:
            loader.update(batch_size=8, shuffle=False, num_workers=0)
            for key in ("prefetch_factor", "persistent_workers", "micro_batch_size"):
                loader.pop(key, None)
            if program not in ENCODER_FAMILIES_2_2:
                loader.pop("max_sequence_length", None)  # "sample" files fix the length
    if program in VISION_CONFIGS:
        tiny_vision(program, model, loaders, steps)
    if program in MULTIMODAL_CONFIGS:
        tiny_multimodal(program, model, loaders, data)
    if program in ENCODER_FAMILIES_2_2:
        encoder_files(program, model, loaders, data)
    if program in SEQ2SEQ_FAMILIES_2_2:
        tiny_seq2seq(program, model, loaders, data)
    val = loaders[1]
    trainer["fit"] = {"train_dataloader": loaders[0]}
    trainer["validate"] = {"val_dataloader": val}
    trainer.pop("validate_all", None)
    return params


# Vision families (Release 2.3+): image folders written offline, a shrunk image encoder

VISION_CONFIGS = {  # family: (its folder under models/, the shipped configuration derived from)
    "vision_transformer": ("vision/vision_transformer",
                           "params_vit_base_patch_16_imagenet_1k.yaml"),
    "dino": ("vision/dino", "params_dinov2_large_patch16_img224.yaml"),
    "generic_image_encoders": ("vision/generic_image_encoders",
                               "../../dino/configs/params_dinov2_large_patch14_img224.yaml"),
    "dit": ("vision/dit", "params_dit_small_patchsize_2x2.yaml"),
}
"""Release 2.3+ vision families this tool writes data for (part of TRAINER_CONFIGS).
generic_image_encoders' folder ships no configuration: its trial is DINOv2's with separate
DINO and iBOT heads, the model and data processor named by their generic names (DinoModel and
DinoImageDataProcessor only rename BaseSSLArch and BaseImageDataProcessor)."""

SSL_FAMILIES = ("dino", "generic_image_encoders")
"""The self-supervised image encoders: trunks, heads and losses built from a list each."""

TRAINER_CONFIGS.update(VISION_CONFIGS)

VISION_FAMILIES_2_2 = {"dit": "params_dit_small_patchsize_2x2.yaml"}
"""Release 2.2's vision families this tool writes data for: family, its smallest shipped
configuration (the 2.10 latent files are the same). Not in ``--program all``: see NOT_RUN_2_2."""


TINY_VISION = {"hidden_size": 64, "num_heads": 4, "num_hidden_layers": 2, "filter_size": 128,
               "image_size": [32, 32], "patch_size": [8, 8]}
"""A vision transformer small enough for two cores: 32x32 images in 16 patches of 8x8."""








def deterministic_transforms(transforms: list, size: list) -> list:
    """A data processor's ``transforms:`` list without its random augmentations (crops, flips:
    they draw from torch's global generator, whose state differs between CPU and CSX, the
    resumed run and the real package), its sizes the trial's image size."""
    return [{**t, **({"size": list(size)} if "size" in t else {})} for t in transforms
            if not t["name"].startswith("random_")]


def tiny_vision(program: str, model: dict, loaders: list, steps: int) -> None:
    """Shrink a shipped vision configuration in place, keeping its structure (patch embedding,
    position embedding, class token, norms, nonlinearity, pooler): sizes from TINY_VISION,
    VISION_CLASSES classes, no dropout; the loaders read the trial's images at that size
    without random augmentations and from the trial's folder, not a worker cache (a CSX
    cluster's copy of the data on its worker nodes)."""
    if program in SSL_FAMILIES:
        tiny_ssl(program, model, loaders, steps)
        return
    if program == "dit":
        tiny_dit(model, loaders)
        return
    size = TINY_VISION["image_size"]
    model.update(copy.deepcopy(TINY_VISION), num_classes=VISION_CLASSES)
    _no_dropout(model)
    for loader in loaders:
        # the vision processors' defaults start worker processes, which the trials run without
        loader.update(image_size=list(size), use_worker_cache=False,
                      prefetch_factor=None, persistent_workers=False)
        if "transforms" in loader:
            loader["transforms"] = deterministic_transforms(loader["transforms"], size)


TINY_DIT = {"hidden_size": 64, "num_heads": 4, "num_hidden_layers": 2, "filter_size": 128,
            "frequency_embedding_size": 64}
"""A DiT small enough for two cores (its latents: LATENT)."""


def tiny_dit(model: dict, loaders: list) -> None:
    """Shrink a shipped DiT configuration in place, keeping its structure (patch embedding,
    adaLN-zero blocks, timestep and label embeddings, diffusion schedule): sizes from TINY_DIT,
    latents of LATENT, no dropout in the transformer. The label dropout of classifier-free
    guidance stays: it is the data processor's (its null label the processor's fixed 1000
    ImageNet classes, which the model keeps), drawn with the diffusion noise and timesteps from
    torch's global generator. The loaders read the two latent folders, each latent's folder
    chosen by a generator seeded 1 (unseeded, the processor seeds it from torch's global
    generator) and in a single process (their ``num_workers`` must be positive when set)."""
    model.update(copy.deepcopy(TINY_DIT))
    for key, value in list(model.items()):
        if "dropout" in key and key != "label_dropout_rate" and isinstance(value, float):
            model[key] = 0.0
    model["vae"] = dict(model["vae"], **copy.deepcopy(LATENT))
    for loader in loaders:
        loader["data_dir"] = [str(Path(loader["data_dir"]) / name) for name in LATENT_FOLDERS]
        loader.pop("num_workers", None)
        loader.update(use_worker_cache=False, shuffle_seed=1)
        if "image_size" in loader:  # Release 2.2's: the VAE's image, 8 times the latent
            loader["image_size"] = [8 * side for side in LATENT["latent_size"]]


def _no_dropout(model: dict) -> None:
    for key, value in list(model.items()):
        if ("dropout" in key or "drop_prob" in key) and isinstance(value, (int, float)) \
                and not isinstance(value, bool):
            model[key] = 0.0


TINY_SSL_HEAD = {"hidden_size": 128, "output_size": 256, "bottleneck_size": 32}
"""The DINO/iBOT heads' sizes in the trials (their input the trunk's hidden size)."""

LOCAL_IMAGE_SIZE = 16
"""The side of DINO's local crops in the trials (the global crops: TINY_VISION's image size)."""


def tiny_ssl(program: str, model: dict, loaders: list, steps: int) -> None:
    """Shrink a DINOv2 configuration in place, keeping its structure (the teacher and student
    trunks, heads, losses, weight copies, EMA and frozen teacher; the multi-crop and masked
    patch transforms with their augmentations): each trunk as TINY_VISION with local crops of
    LOCAL_IMAGE_SIZE, no dropout or stochastic depth; heads of TINY_SSL_HEAD; the losses' and
    EMA's schedules (teacher temperature warm-up, EMA decay) over the run's steps, their warm-up
    its share of the shipped schedule; the data processors at those sizes, from the trial's
    image folders and under their generic names for generic_image_encoders."""
    size, patch = TINY_VISION["image_size"], TINY_VISION["patch_size"]
    if program == "generic_image_encoders":
        model["name"] = "generic_image_encoders"
    # the shipped configuration shares settings between trunks and heads through YAML
    # anchors: shrink copies, each once
    for trunk in model["image_model_trunks"]:
        trunk["image_model"] = vit = copy.deepcopy(trunk["image_model"])
        vit.update(copy.deepcopy(TINY_VISION))
        _no_dropout(vit)
        if isinstance(vit.get("interpolate_position_embedding"), dict):
            vit["interpolate_position_embedding"]["local_patch_dims"] = [
                LOCAL_IMAGE_SIZE // patch[0], LOCAL_IMAGE_SIZE // patch[1]]
    for head in model["heads"]:
        head["head_model"] = dict(head["head_model"], input_size=TINY_VISION["hidden_size"],
                                  **TINY_SSL_HEAD)
    for loss in model["losses"]:
        loss["loss"] = dict(loss["loss"])
        if "input_size" in loss["loss"]:
            loss["loss"]["input_size"] = TINY_SSL_HEAD["output_size"]
        _run_schedule(loss["loss"], steps, "warmup_teacher_temp_steps")
    for ema in model.get("ema") or []:
        ema["scheduler_params"] = dict(ema.get("scheduler_params") or {})
        _run_schedule(ema["scheduler_params"], steps)
    for loader in loaders:
        if program == "generic_image_encoders":
            loader["data_processor"] = "BaseImageDataProcessor"
        loader["dataset"] = dict(loader["dataset"], root=loader.pop("data_dir"))
        loader.update(prefetch_factor=None, persistent_workers=False)
        ssl = loader["ssl_transform"] = copy.deepcopy(loader["ssl_transform"])
        crops = ssl.get("multi_crop_transform")
        if crops:
            crops.update(global_image_size=size[0], local_image_size=LOCAL_IMAGE_SIZE)
        masks = ssl.get("masked_patch_transform")
        if masks:
            masks.update(image_size=size[0], patch_size=patch[0])


def _run_schedule(spec: dict, steps: int, warmup: str | None = None) -> None:
    """A schedule's ``total_steps`` the run's ``steps``, and its warm-up (``warmup``) the same
    share of them as of the shipped total."""
    if "total_steps" not in spec:
        return
    if warmup and warmup in spec:
        spec[warmup] = max(1, round(steps * spec[warmup] / spec["total_steps"]))
    spec["total_steps"] = steps


# Multimodal families: an image encoder, a projector and a text decoder, each shrunk

MULTIMODAL_CONFIGS = {  # family: (its folder under models/, the shipped configuration)
    "llava": ("multimodal/llava", "params_llava_v1p5_pretrain_7b_phase1_MSL2K.yaml"),
    "multimodal_simple": ("multimodal/multimodal_simple", "params_mm_llava_llama2_7b_phase1.yaml"),
}
"""Release 2.3+ multimodal families this tool writes data for (part of TRAINER_CONFIGS): the
phase-1 configurations (the image encoder and the text decoder frozen, the projector trained
on images and their captions)."""

TRAINER_CONFIGS.update(MULTIMODAL_CONFIGS)

MULTIMODAL_FAMILIES_2_2 = {"llava": "params_llava_v1p5_pretrain_7b_phase1_MSL2K.yaml"}
"""Release 2.2's multimodal families: family, its smallest shipped phase-1 configuration."""


def image_encoders(program: str, model: dict) -> tuple[list, list]:
    """(the image encoders' sections, the projectors' sections) of a multimodal model
    configuration: LLaVA's ``image_model`` and ``projector``; multimodal_simple's
    ``image_model_list`` of encoders, each with an optional projection, and its global
    projection."""
    if program == "llava":
        return [model["image_model"]], list((model.get("projector") or {}).values())
    images = model["image_model_list"]
    encoders = [m["image_encoder"] for m in images["image_models"]]
    projectors = [m["projection_layer"] for m in images["image_models"]
                  if m.get("projection_layer")]
    if images.get("global_image_projection"):
        projectors.append(images["global_image_projection"])
    return encoders, projectors


def image_patches(program: str, model: dict) -> int:
    """The patch tokens a multimodal model puts in a sequence for one image (every encoder's
    patches, without their class tokens)."""
    encoders, _ = image_encoders(program, model)
    return sum((e["image_size"][0] // e["patch_size"][0]) * (e["image_size"][1] //
               e["patch_size"][1]) for e in encoders)


def tiny_multimodal(program: str, model: dict, loaders: list, data: Path) -> None:
    """Shrink a shipped multimodal configuration in place, keeping its structure (the
    encoder's patch embedding, class token, feature layer and selection; the projector's
    layers and activations; the decoder's rotary positions, norms and nonlinearity; what is
    frozen): each image encoder as TINY_VISION without dropout, the text decoder by
    :func:`tiny_decoder`, each projector layer TINY_VISION's width in and TINY_DECODER's out;
    the loaders read the trial's token files and its ``images/`` folder at that image size,
    without random augmentations and from the trial's folder, not a worker cache."""
    encoders, projectors = image_encoders(program, model)
    for vit in encoders:
        vit.update(copy.deepcopy(TINY_VISION))
        _no_dropout(vit)
    tiny_decoder(model["text_model"])
    for ffn in projectors:
        ffn["input_unit"] = TINY_VISION["hidden_size"]
        ffn["layers_units"] = [TINY_DECODER["hidden_size"]] * len(ffn["layers_units"])
        _no_dropout(ffn)
    size = TINY_VISION["image_size"]
    for loader in loaders:
        loader.update(img_data_dir=str(data / "images"), image_data_size=[3, *size],
                      use_worker_cache=False)
        loader["transforms"] = deterministic_transforms(loader["transforms"], size)


def write_multimodal_data(program: str, model: dict, data: Path, release_2_2: bool) -> None:
    """The token files and images ``program``'s shipped data processor reads, for the
    (shrunk) ``model``: its sequence length and image patches."""
    msl, patches = model["text_model"]["max_position_embeddings"], image_patches(program, model)
    if program == "llava":
        write_llava_hdf5(data, patches, vsl_features=release_2_2, msl=msl,
                         vocab=model["text_model"]["vocab_size"])
    else:
        write_multimodal_simple_hdf5(data, patches, msl=msl,
                                     vocab=model["text_model"]["vocab_size"])


RAY_START_TIMEOUT = "The current node timed out during startup"
"""What Ray raises when its node does not register within its fixed 30 s (a loaded machine)."""

DONE = re.compile(r"(Training|Evaluation) completed successfully!")


def run_program(python: str, run_py: Path, backend: str, mode: str, params: Path,
                model_dir: Path, env: dict, log: Path, extra: tuple = (),
                timeout: int = 1200, reuse: bool = False) -> dict:
    """Run ``run.py`` once; its exit code, losses by step, eval loss, metrics and seconds.
    ``reuse``: a log of an earlier call that ends in success is read instead of running again.
    A run whose Ray node timed out during startup runs once more (``"ray_retried"``)."""
    cmd = [python, str(run_py), backend, "--mode", mode, "--params", str(params),
           "--model_dir", str(model_dir), *extra]
    if reuse and log.exists() and DONE.search(log.read_text()):
        rc, seconds, retried = 0, None, False
    else:
        for attempt in range(2):
            start = time.monotonic()
            with open(log, "w") as out:
                rc = subprocess.run(cmd, cwd=params.parent, env=env, stdout=out,
                                    stderr=subprocess.STDOUT, timeout=timeout).returncode
            seconds, retried = round(time.monotonic() - start, 1), attempt > 0
            if rc == 0 or RAY_START_TIMEOUT not in log.read_text():
                break
    text = log.read_text()
    found = {"rc": rc, "seconds": seconds,
             "losses": {int(s): float(v) for s, v in LOSS.findall(text)},
             "metrics": {k: float(v) for k, v in METRIC.findall(text)}, "log": str(log)}
    if retried:
        found["ray_retried"] = True
    if m := EVAL_LOSS.search(text):
        found["eval_loss"] = float(m.group(1))
    if rc != 0:
        found["error"] = text.strip().splitlines()[-1] if text.strip() else "no output"
    return found


def runnable(release: Path) -> list[str]:
    """The families of ``release`` this tool runs."""
    if is_trainer_release(release):
        return list(TRAINER_CONFIGS)
    if code_root(release)[0].name == "src":
        return [f for f in FAMILIES_2_2 if f == "fc_mnist" or f in DECODER_FAMILIES_2_2
                or f in ENCODER_FAMILIES_2_2 or f in SEQ2SEQ_FAMILIES_2_2 or f == "dpr"
                or f in MULTIMODAL_FAMILIES_2_2]
    return [f for f in families_legacy(release) if f in LEGACY_CONFIGS]


def trial(args, program: str) -> dict:
    run_py, shipped, root = program_paths(args.release, program)
    work = args.work / f"{args.release.name}-{program}-{args.precision}"
    if not args.reuse:
        shutil.rmtree(work, ignore_errors=True)
    data = work / "data"
    params = work / "params.yaml"
    release_2_2 = root.name == "src"
    if is_trainer_release(args.release):
        written = trainer_params_for(program, shipped, data, args.steps, args.precision)
    else:
        written = params_for(program, shipped, data, args.steps, args.precision, release_2_2,
                             half_flag(args.release))
    if program == "fc_mnist":
        write_mnist(data)
    elif program == "unet":
        write_severstal(data)
    elif program in VISION_CONFIGS:
        write_vision_data(program, data)
    elif program in MULTIMODAL_CONFIGS:
        model = written["trainer"]["init"]["model"] if "trainer" in written else written["model"]
        write_multimodal_data(program, model, data,
                              release_2_2=not is_trainer_release(args.release))
    elif program in ENCODER_FAMILIES_2_2:
        model = written["trainer"]["init"]["model"] if "trainer" in written else written["model"]
        for processor in encoder_processors(written):
            write_bert_data(data, processor, vocab=model["vocab_size"],
                            special=ESM2_SPECIAL if program == "esm2" else None)
    elif program == "dpr":
        write_dpr_hdf5(data)
    elif program in SEQ2SEQ_FAMILIES_2_2:
        model = written["trainer"]["init"]["model"] if "trainer" in written else written["model"]
        write_seq2seq_data(data, program, extra_ids=int(model.get("extra_ids") or 0))
    else:
        write_gpt_hdf5(data, pairs=program == "dpo")
    params.write_text(yaml.safe_dump(written))
    env = _cstream_env(root, args)
    first = checkpoint_every(args.steps)
    runs = {}
    for backend in ("CPU", "CSX"):
        full, resumed = work / f"{backend}-full", work / f"{backend}-resumed"
        log = work / f"{backend}-train.log"
        if not (args.reuse and log.exists() and DONE.search(log.read_text())):
            shutil.rmtree(full, ignore_errors=True)  # the flow would resume from what is there
        runs[f"{backend} train"] = run_program(args.python, run_py, backend, "train", params,
                                               full, env, work / f"{backend}-train.log",
                                               reuse=args.reuse)
        start, last = full / f"checkpoint_{first}.mdl", full / f"checkpoint_{args.steps}.mdl"
        if not start.exists() or not last.exists():
            skipped = {"rc": None, "losses": {}, "metrics": {}, "seconds": 0,
                       "error": f"not run: training wrote no {start.name} and {last.name}"}
            runs[f"{backend} resume"] = runs[f"{backend} eval"] = skipped
            continue
        log = work / f"{backend}-resume.log"
        # a Trainer resumes from --checkpoint_path (its autoload reads the checkpoints a run
        # recorded in its model folder's index); the older flows from a checkpoint they find
        trainer_release = is_trainer_release(args.release)
        if not (args.reuse and log.exists() and DONE.search(log.read_text())):
            shutil.rmtree(resumed, ignore_errors=True)
            resumed.mkdir()
            if not trainer_release:
                shutil.copy(start, resumed)
        runs[f"{backend} resume"] = run_program(
            args.python, run_py, backend, "train", params, resumed, env, log, reuse=args.reuse,
            extra=("--checkpoint_path", str(start)) if trainer_release else ())
        runs[f"{backend} eval"] = run_program(
            args.python, run_py, backend, "eval", params, work / f"{backend}-eval", env,
            work / f"{backend}-eval.log", extra=("--checkpoint_path", str(last)),
            reuse=args.reuse)
    figures = compare(runs)
    figures["CSX vs CPU, weights at the last step"] = weights_gap(work, args.steps)
    if args.real_python:
        runs.update(real_package_runs(args, run_py, params, root, work))
        figures["real package"] = compare_real(runs)
    return {"release": args.release.name, "program": program, "precision": args.precision,
            "steps": args.steps, "resumed_from": first, "runs": runs, "work": str(work),
            "compare": figures}


def real_package_runs(args, run_py: Path, params: Path, root: Path, work: Path) -> dict:
    """The same program and configuration on the real cerebras-pytorch's CPU backend (its own
    interpreter, ``--real-python``, with only the Model Zoo on the path), trained from the
    initial weights of cstream's CPU run (its ``checkpoint_0.mdl``: the two packages draw their
    initial weights differently), and the checkpoints crossed over: the real package evaluates
    cstream's last CPU checkpoint, cstream the real package's."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(str(p) for p in [root, *args.pythonpath]))
    full = work / "real-full"
    last = f"checkpoint_{args.steps}.mdl"
    initial = work / "CPU-full" / "checkpoint_0.mdl"
    runs = {"real train": run_program(
        args.real_python, run_py, "CPU", "train", params, full, env, work / "real-train.log",
        reuse=args.reuse, extra=("--checkpoint_path", str(initial)) if initial.exists() else ())}
    crossed = {
        "real eval": (args.real_python, env, full / last),
        "real eval of cstream's checkpoint": (args.real_python, env, work / "CPU-full" / last),
        "cstream eval of the real checkpoint": (args.python, _cstream_env(root, args),
                                                full / last),
    }
    for name, (python, run_env, checkpoint) in crossed.items():
        if not checkpoint.exists():
            runs[name] = {"rc": None, "losses": {}, "metrics": {}, "seconds": 0,
                          "error": f"not run: no {checkpoint}"}
            continue
        slug = name.replace(" ", "-").replace("'", "")
        runs[name] = run_program(python, run_py, "CPU", "eval", params, work / slug, run_env,
                                 work / f"{slug}.log", extra=("--checkpoint_path", str(checkpoint)),
                                 reuse=args.reuse)
    return runs


def _cstream_env(root: Path, args) -> dict:
    path = [str(REPO), str(root), *args.pythonpath, os.environ.get("PYTHONPATH", "")]
    return dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in path if p),
                RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")


def compare_real(runs: dict) -> dict:
    """cstream's CPU and CSX training losses against the real package's, and the evaluation
    losses of the four (program, checkpoint) pairs."""
    out = {}
    real = runs["real train"]["losses"]
    for backend in ("CPU", "CSX"):
        gap, n = _max_gap(runs[f"{backend} train"]["losses"], real)
        ok, _, _ = within_bf16(runs[f"{backend} train"]["losses"], real)
        out[f"{backend} train vs real"] = {"max_abs_loss_gap": gap, "steps_compared": n,
                                            "within_one_bf16_unit": ok}
    out["eval losses"] = {name: runs[name].get("eval_loss") for name in (
        "CPU eval", "real eval", "real eval of cstream's checkpoint",
        "cstream eval of the real checkpoint")}
    return out


def _max_gap(a: dict, b: dict):
    steps = sorted(set(a) & set(b))
    return (max(abs(a[s] - b[s]) for s in steps), len(steps)) if steps else (None, 0)


def compare(runs: dict) -> dict:
    """Largest loss gaps: CSX against CPU (train and eval) and each resumed run against its
    uninterrupted run over the steps both logged."""
    out = {}
    for name, (a, b) in {"CSX vs CPU, train": ("CSX train", "CPU train"),
                         "CPU resumed vs uninterrupted": ("CPU resume", "CPU train"),
                         "CSX resumed vs uninterrupted": ("CSX resume", "CSX train")}.items():
        gap, n = _max_gap(runs[a]["losses"], runs[b]["losses"])
        out[name] = {"max_abs_loss_gap": gap, "steps_compared": n}
    cpu, csx = runs["CPU eval"].get("eval_loss"), runs["CSX eval"].get("eval_loss")
    out["CSX vs CPU, eval loss"] = {"CPU": cpu, "CSX": csx,
                                    "gap": None if cpu is None or csx is None else abs(cpu - csx)}
    return out


def weights_gap(work: Path, steps: int) -> dict | None:
    """The model weights of the CPU and CSX runs' last checkpoints side by side: the largest
    absolute difference over all weights, relative to the largest weight, and how many
    tensors; None where a checkpoint is missing. Finer than the logged losses: under mixed
    precision the weights stay float32 while the losses are logged in the half dtype."""
    import h5py
    import hdf5plugin  # noqa: F401  (registers the LZ4 filter checkpoints are written with)

    paths = [work / f"{b}-full" / f"checkpoint_{steps}.mdl" for b in ("CPU", "CSX")]
    if not all(p.exists() for p in paths):
        return None
    with h5py.File(paths[0], "r") as cpu, h5py.File(paths[1], "r") as csx:
        names = []
        cpu.visit(lambda n: names.append(n) if n.startswith("model.")
                  and isinstance(cpu[n], h5py.Dataset) else None)
        gap = scale = 0.0
        for n in names:
            a = np.asarray(cpu[n], dtype=np.float64)
            b = np.asarray(csx[n], dtype=np.float64)
            gap, scale = max(gap, float(np.abs(a - b).max())), max(scale, float(np.abs(a).max()))
    return {"max_abs_weight_gap": gap, "max_abs_weight": scale, "tensors": len(names)}


def table(paths: list[Path]) -> str:
    """A markdown table of trial results (JSON files written with ``--out``)."""
    rows = ["| release, program, precision | runs (exit 0 of 6) | CSX vs CPU: largest train loss gap "
            "(steps) | resumed vs uninterrupted, CPU / CSX | eval loss CPU / CSX |",
            "| --- | --- | --- | --- | --- |"]
    for path in paths:
        r = json.loads(path.read_text())
        c = r["compare"]
        ok = sum(run["rc"] == 0 for run in r["runs"].values())

        def gap(name):
            g = c[name]["max_abs_loss_gap"]
            return "not run" if g is None else f"{g:.2g}"

        ev = c["CSX vs CPU, eval loss"]
        rows.append(
            f"| {r['release']} {r['program']}, {r['precision']} | {ok} | "
            f"{gap('CSX vs CPU, train')} ({c['CSX vs CPU, train']['steps_compared']}) | "
            f"{gap('CPU resumed vs uninterrupted')} / {gap('CSX resumed vs uninterrupted')} "
            f"(from step {r['resumed_from']}) | {ev['CPU']:.5f} / {ev['CSX']:.5f} |")
    return "\n".join(rows)


NOT_RUN_2_2 = {
    "dit": "not run: Release 2.2.1's config validator reads `typing.List.__args__` of "
           "DiTConfig's bare `latent_size: List` field, which Python 3.9 and later do not have "
           "(`AttributeError: __args__`, with the shipped configuration too; the Model Zoo "
           "venv's Python is 3.11); `--program dit` writes 2.10's latent files and a "
           "configuration shrunk as 2.10's",
    "vision_transformer": "Release 2.2.1 ships no configuration for it (its folder has no "
                          "configs/), so there is no shipped config to derive a tiny one from",
}
"""Why a Release 2.2 family has no trial results (its row in the table says so)."""

NOT_RUN_LEGACY = {
    "layers_api_demo": "not run: the program's own `model.py` calls "
                       "`GPTLMHeadModelLoss(self.ntokens, 1.0 / self.ntokens)`, and the Model "
                       "Zoo's `GPTLMHeadModelLoss` of Releases 2.0 and 2.1 takes `(vocab_size, "
                       "loss_scaling, loss_weight)`: `TypeError: ... missing 1 required "
                       "positional argument: 'loss_weight'` as the model is built, on CPU and "
                       "CSX alike",
}
"""Why a Release 2.0/2.1 family has no trial results (its row in the table says so)."""


def not_run_reasons(release: str) -> dict:
    """family -> why it has no trial results, for the release named ``release``."""
    if release.startswith("Release_2.2"):
        return NOT_RUN_2_2
    if release.startswith(("Release_2.0", "Release_2.1")):
        return NOT_RUN_LEGACY
    return {}


NO_REAL_PACKAGE = {
    release: "no real package to compare: PyPI has cerebras-pytorch 2.6.0-2.10.0 only"
    for release in ("Release_2.0.2", "Release_2.0.3", "Release_2.1.0", "Release_2.1.1",
                    "Release_2.2.0", "Release_2.2.1")
}


def bf16_unit(loss: float) -> float:
    """One bfloat16 unit in the last place at ``loss`` (8 significant bits)."""
    return 2.0 ** (np.floor(np.log2(abs(loss))) - 7) if loss else 2.0 ** -133


def within_bf16(a: dict, b: dict) -> tuple[bool, float, int]:
    """(every common step's gap is within one bfloat16 unit of the loss, largest gap, steps)."""
    steps = sorted(set(a) & set(b))
    gaps = [(abs(a[s] - b[s]), bf16_unit(max(abs(a[s]), abs(b[s])))) for s in steps]
    return bool(steps) and all(g <= u for g, u in gaps), max((g for g, _ in gaps), default=0.0), \
        len(steps)


def family_row(r: dict) -> tuple[list[str], bool]:
    """The cells of one trial's row and whether train, eval and resume ran on CSX equal to
    CPU (every run exited 0, both resumes exact, CSX's train and eval losses within the
    precision's bound of CPU's)."""
    runs, c = r["runs"], r["compare"]

    def ran(name):
        run = runs[name]
        if run["rc"] == 0:
            return "ok"
        return f"fails: {(run.get('error') or '')[:120]}"

    def resumed(backend):
        g = c[f"{backend} resumed vs uninterrupted"]
        if runs[f"{backend} resume"]["rc"] != 0 or not g["steps_compared"]:
            return f"fails: {(runs[f'{backend} resume'].get('error') or 'no losses')[:120]}"
        return "exact" if g["max_abs_loss_gap"] == 0 else f"differs by {g['max_abs_loss_gap']:.3g}"

    train_ok, n = False, 0
    cpu, csx = runs["CPU train"]["losses"], runs["CSX train"]["losses"]
    if cpu and csx:
        if r["precision"] == "mixed-bf16":
            train_ok, gap, n = within_bf16(csx, cpu)
        else:
            gap, n = _max_gap(csx, cpu)
            train_ok = gap == 0
        ev = c["CSX vs CPU, eval loss"]
        eval_ok = ev["gap"] is not None and (
            ev["gap"] <= bf16_unit(max(ev["CPU"], ev["CSX"])) if r["precision"] == "mixed-bf16"
            else ev["gap"] == 0)
        equal = f"{'yes' if train_ok and eval_ok else 'no'}: train gap {gap:.3g} ({n} steps)" + \
            (f", eval gap {ev['gap']:.3g}" if ev["gap"] is not None else ", no eval loss")
        w = c.get("CSX vs CPU, weights at the last step")
        if w:
            equal += f"; weights {w['max_abs_weight_gap']:.2g} (largest {w['max_abs_weight']:.2g})"
    else:
        eval_ok, equal = False, "not compared: a training run failed"
    cells = [ran("CPU train"), ran("CSX train"), f"{ran('CPU eval')} / {ran('CSX eval')}",
             f"{resumed('CPU')} / {resumed('CSX')}", equal, real_package_cell(r)]
    # cstream's six runs (the real package's are the last column's)
    ok = all(run["rc"] == 0 for name, run in runs.items() if name.split()[0] in ("CPU", "CSX")) \
        and train_ok and eval_ok and all(resumed(b) == "exact" for b in ("CPU", "CSX"))
    return cells, ok


EVAL_CROSSOVER_RTOL = 1e-5
"""How close two packages' evaluation losses of one checkpoint must be: the real package runs
torch 2.4 and cstream torch 2.13, whose float32 CPU kernels differ by a few ulps, and an
evaluation loss averages several batches' (about 80 float32 ulps at the loss)."""


def _same_eval(a: float, b: float) -> bool:
    return a is not None and b is not None and abs(a - b) <= EVAL_CROSSOVER_RTOL * abs(b)


REAL_RUNS = ("real train", "real eval", "real eval of cstream's checkpoint",
             "cstream eval of the real checkpoint")


def real_matches(r: dict) -> bool:
    """Whether the real package ran the trial, its checkpoints and cstream's cross over, and
    its training losses from the same initial weights are within one bfloat16 unit of
    cstream's on CPU and on CSX."""
    real = r["compare"].get("real package")
    if real is None or any(r["runs"][n]["rc"] != 0 for n in REAL_RUNS):
        return False
    ev = real["eval losses"]
    return (_same_eval(ev["real eval of cstream's checkpoint"], ev["CPU eval"])
            and _same_eval(ev["cstream eval of the real checkpoint"], ev["real eval"])
            and real["CPU train vs real"]["within_one_bf16_unit"]
            and real["CSX train vs real"]["within_one_bf16_unit"])


def real_package_cell(r: dict) -> str:
    """What the real package's run of the same program says: its evaluation of cstream's
    checkpoint and cstream's of its checkpoint against each package's own, and the training
    losses side by side."""
    real = r["compare"].get("real package")
    if real is None:
        return NO_REAL_PACKAGE.get(r["release"], "not compared: the trial ran without "
                                   "--real-python")
    runs, ev = r["runs"], real["eval losses"]
    failed = [n for n in REAL_RUNS if runs[n]["rc"] != 0]
    if failed:
        return f"{failed[0]} fails: {(runs[failed[0]].get('error') or '')[:120]}"
    crossed = _same_eval(ev["real eval of cstream's checkpoint"], ev["CPU eval"]) and \
        _same_eval(ev["cstream eval of the real checkpoint"], ev["real eval"])
    train = real["CPU train vs real"]
    of_cstreams, of_reals = ev["real eval of cstream's checkpoint"], \
        ev["cstream eval of the real checkpoint"]

    def vs(a, b) -> str:
        return "=" if _same_eval(a, b) else "against"

    return (f"checkpoints cross over: {'equal' if crossed else 'differ'} (real evaluates "
            f"cstream's {of_cstreams:.6g} {vs(of_cstreams, ev['CPU eval'])} cstream's "
            f"{ev['CPU eval']:.6g}; cstream evaluates the real one's "
            f"{of_reals:.6g} {vs(of_reals, ev['real eval'])} real's {ev['real eval']:.6g}); "
            f"training from the same initial weights: losses "
            f"{'within one bf16 unit' if train['within_one_bf16_unit'] else 'differ'}, largest "
            f"gap {train['max_abs_loss_gap']:.3g} ({train['steps_compared']} steps)")


def families_2_10(release: Path) -> list[str]:
    """The model families of a Release 2.3+ checkout: the folders of ``models/`` with a
    ``run.py`` (bert's fine-tuning heads as ``bert_<head>``)."""
    models = code_root(release)[1] / "models"
    return sorted("_".join(p.parent.relative_to(models).parts[1:])
                  for p in models.glob("*/**/run.py"))


def import_probe(release: Path, python: str, family: str = "gpt3") -> str | None:
    """Run ``family``'s ``run.py`` of a Release 2.3+ checkout with its shipped configuration on
    CPU; None when it gets past the imports, else the error it stopped with (its last line)."""
    root, code = code_root(release)
    folder = code / "models" / "nlp" / family
    config = sorted((folder / "configs").glob("*.yaml"))[0]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), str(root)]),
               RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")
    done = subprocess.run([python, str(folder / "run.py"), "CPU", "--mode", "train", "--params",
                           str(config), "--model_dir", "/tmp/cstream-modelzoo-probe"],
                          env=env, capture_output=True, text=True, timeout=900)
    lines = [ln for ln in (done.stdout + done.stderr).strip().splitlines() if ln.strip()]
    errors = [ln for ln in lines if re.match(r"[\w.]*(Error|Exception)\b", ln)]
    if done.returncode == 0 or not errors:
        return None
    return re.sub(r" \(/[^)]*\)$", "", errors[-1])  # without the file it names


def families_table(release: str, paths: list[Path], release_dir: Path | None = None) -> str:
    """The families table of docs/modelzoo.md for one release: a row per family, from the
    trial results in ``paths`` and, for a family without one, the reason it was not run."""
    results = {}
    for path in paths:
        r = json.loads(path.read_text())
        if r["release"] == release:
            results[r["program"]] = r
    if release.startswith("Release_2.2"):
        families = FAMILIES_2_2
    elif release_dir is not None and is_legacy_release(release_dir):
        families = families_legacy(release_dir)
    elif release_dir is not None:
        families = families_2_10(release_dir)
    else:
        families = sorted(results)
    rows = ["| family | train CPU | train CSX | eval CPU / CSX | resume CPU / CSX | "
            "CSX = CPU | matches the real package |", "| --- | --- | --- | --- | --- | --- | --- |"]
    good, real_good = [], []
    for family in families:
        if family in results:
            cells, ok = family_row(results[family])
            good += [family] * ok
            real_good += [family] * real_matches(results[family])
            precision = results[family]["precision"]
            rows.append(f"| {family} ({precision}) | " + " | ".join(cells) + " |")
        else:
            reason = not_run_reasons(release).get(
                family, "not run for time: the trials on the shared machine were stopped "
                "before it finished")
            rows.append(f"| {family} | {reason} | | | | | "
                        f"{NO_REAL_PACKAGE.get(release, 'not run: no cstream runs to compare')} |")
    rows.append("")
    rows.append(f"{len(good)} of {len(families)} families train, evaluate and resume on CSX "
                f"equal to CPU ({', '.join(good) or 'none'}); {len(real_good)} of {len(families)} "
                f"equal to the real package ({', '.join(real_good) or 'none'}).")
    return "\n".join(rows)


def main(argv=None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    if argv[:1] == ["--table"]:
        print(table([Path(p) for p in argv[1:]]))
        return 0
    if argv[:1] == ["--families-table"]:  # --families-table RELEASE_DIR FILE...
        release_dir = Path(argv[1])
        print(families_table(release_dir.name, [Path(p) for p in argv[2:]],
                             release_dir if release_dir.is_dir() else None))
        return 0
    if argv[:1] == ["--recompare"]:  # --recompare WORK_ROOT FILE...: add the weights' gap
        for path in map(Path, argv[2:]):
            r = json.loads(path.read_text())
            found = sorted(Path(argv[1]).glob(f"**/{r['release']}-{r['program']}-{r['precision']}"))
            if found:
                r["work"] = str(found[0])
                r["compare"]["CSX vs CPU, weights at the last step"] = weights_gap(found[0],
                                                                                   r["steps"])
                path.write_text(json.dumps(r, indent=1) + "\n")
        return 0
    if argv[:1] == ["--probe"]:  # --probe RELEASE_PATH PYTHON: the 2.3+ table's rows
        release, python = Path(argv[1]), argv[2]
        error = import_probe(release, python)
        print(f"gpt3 run.py CPU --mode train: {error or 'past the imports'}")
        reason = f"not run: gpt3's run.py stops with `{error}`, and every program of this " \
            "release starts through the same `cerebras.modelzoo.trainer`" if error else \
            "not run for time"
        print("| family | train CPU | train CSX | eval CPU / CSX | resume CPU / CSX | "
              "CSX = CPU | matches the real package |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for family in families_2_10(release):
            print(f"| {family} | {reason} | | | | | not run for time |")
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--release", type=Path, required=True,
                        help="an extracted Model Zoo release (Release_2.0.2, Release_2.2.1, ...)")
    parser.add_argument("--program", action="append", required=True,
                        help="a model family (repeatable; 'all' for every family the release "
                        f"has that this tool runs: Release 2.2 {', '.join(FAMILIES_2_2)})")
    parser.add_argument("--precision", choices=sorted(PRECISIONS), default="fp32")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--work", type=Path, default=Path("/tmp/cstream-modelzoo-trials"))
    parser.add_argument("--pythonpath", action="append", default=[],
                        help="a folder the Model Zoo's imports need (repeatable)")
    parser.add_argument("--python", default=sys.executable,
                        help="the interpreter that runs the programs (a venv with the Model "
                        "Zoo's requirements)")
    parser.add_argument("--real-python",
                        help="also run each program on the real cerebras-pytorch's CPU backend "
                        "with this interpreter (a venv with the real package and the Model Zoo's "
                        "requirements), and evaluate each package's checkpoint with the other")
    parser.add_argument("--reuse", action="store_true",
                        help="keep the work folder and read the logs of runs that succeeded "
                        "there instead of running them again")
    parser.add_argument("--out", type=Path,
                        help="write the figures here as JSON (a folder with several programs: "
                        "PROGRAM_RELEASE_PRECISION.json in it)")
    args = parser.parse_args(argv)
    programs = [p for name in args.program for p in (runnable(args.release)
                                                       if name == "all" else [name])]
    failed = 0
    for program in programs:
        result = trial(args, program)
        print(f"== {program} ({args.release.name}, {args.precision})")
        for name, run in result["runs"].items():
            status = "ok" if run["rc"] == 0 else f"FAILED ({run.get('error')})"
            print(f"{name}: {status}, {len(run['losses'])} losses logged, {run['seconds']} s"
                  + (f", eval loss {run['eval_loss']}" if "eval_loss" in run else ""))
        for name, figures in result["compare"].items():
            print(f"{name}: {figures}")
        if args.out:
            out = args.out
            if len(programs) > 1 or out.is_dir():
                out = out / f"{program}_{args.release.name.removeprefix('Release_')}_" \
                    f"{args.precision}.json"
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(result, indent=1) + "\n")
        failed += not all(run["rc"] == 0 for run in result["runs"].values())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
