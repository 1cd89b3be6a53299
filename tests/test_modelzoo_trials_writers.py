"""The data writers of tools/modelzoo_trials.py (in tools/modelzoo_writers.py): each writes the
layout its Model Zoo data processor reads (read back here the way the processor reads it,
without the Model Zoo), and the configuration helpers point a family's sections at those
files."""

import csv
import json

import numpy as np
import pytest

from tools import modelzoo_trials as trials
from tools import modelzoo_writers as writers

MSL = writers.ENCODER_MSL


def meta(folder):
    return {line.split()[0]: int(line.split()[-1])
            for line in (folder / "meta.dat").read_text().splitlines()}


def rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_dynamic_mask_csv(tmp_path):
    writers.write_bert_data(tmp_path, "BertCSVDynamicMaskDataProcessor")
    vocab = (tmp_path / "vocab.txt").read_text().split()
    assert len(vocab) == 512 and vocab[:5] == writers.BERT_SPECIAL
    assert meta(tmp_path) == {"data-0.csv": 64, "data-1.csv": 64}
    for row in rows(tmp_path / "data-0.csv"):
        tokens, segments = eval(row["tokens"]), eval(row["segment_ids"])
        assert len(tokens) == len(segments) <= MSL
        assert tokens[0] == "[CLS]" and tokens[-1] == "[SEP]" and tokens.count("[SEP]") == 2
        assert set(tokens) <= set(vocab) and row["is_random_next"] in ("0", "1")


@pytest.mark.parametrize("special", [None, writers.ESM2_SPECIAL])
def test_premasked_csv_and_hdf5(tmp_path, special):
    import h5py

    writers.write_bert_data(tmp_path, "BertHDF5DataProcessor",
                           vocab=33 if special else 512, special=special)
    sp = {"pad": 0, "mask": 4, "low": 5, "high": 512, **(special or {})}
    csv_rows = rows(tmp_path / "data-1.csv")
    with h5py.File(tmp_path / "data-1.h5") as f:
        data, labels = np.asarray(f["data"]), np.asarray(f["labels"])
    assert data.shape == (64, 2, MSL) and labels.shape == (64, 3, writers.MAX_PREDICTIONS)
    for row, d, lab in zip(csv_rows, data, labels):
        ids, positions = np.array(eval(row["input_ids"])), np.array(eval(row["masked_lm_positions"]))
        assert (ids == d[0]).all() and (np.array(eval(row["attention_mask"])) == d[1]).all()
        assert (ids[positions] == sp["mask"]).all() and (lab[1] == positions).all()
        assert ((lab[0] >= sp["low"]) & (lab[0] < sp["high"])).all()
        assert (ids[d[1] == 0] == sp["pad"]).all()
    params = json.loads((tmp_path / "data_params.json").read_text())
    assert params["dataset"] == {"training_objective": "mlm", "mlm_with_gather": True}


def test_sst2_ner_and_bertsum(tmp_path):
    writers.write_bert_data(tmp_path / "sst2", "SST2DataProcessor")
    with open(tmp_path / "sst2" / "dev.tsv") as f:
        dev = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    assert len(dev) == 64 and {r["label"] for r in dev} <= {"0", "1"}

    writers.write_bert_data(tmp_path / "ner", "BertTokenClassifierDataProcessor")
    label2id = json.loads((tmp_path / "ner" / "label2id.json").read_text())
    assert len(label2id) == 7 and label2id["[PAD]"] == 0
    for row in rows(tmp_path / "ner" / "data-0.csv"):
        tokens, labels = row["tokens"].split(), row["labels"].split()
        assert len(tokens) == len(labels) <= MSL and set(labels) <= set(label2id)

    writers.write_bert_data(tmp_path / "sum", "BertSumCSVDataProcessor")
    for row in rows(tmp_path / "sum" / "data-0.csv"):
        ids, labels, segments, cls = (eval(row[k]) for k in (
            "input_token_ids", "labels", "segment_ids", "cls_indices"))
        assert len(ids) == len(segments) <= MSL
        assert len(cls) == len(labels) <= writers.MAX_CLS_TOKENS
        assert all(ids[i] == 2 for i in cls)  # [CLS]


@pytest.mark.parametrize("program", ["t5", "transformer"])
def test_seq2seq_text(tmp_path, program):
    extra = 100 if program == "t5" else 0
    writers.write_seq2seq_data(tmp_path, program, extra_ids=extra)
    vocab = (tmp_path / "vocab.txt").read_text().split()
    assert vocab[:4] == writers.SEQ2SEQ_SPECIAL and len(vocab) + extra == 512
    lines = (tmp_path / "meta.dat").read_text().splitlines()
    assert len(lines) == 2
    src, tgt = writers.SEQ2SEQ_MSL[program]
    if program == "t5":
        name, count = lines[0].split()
        docs = (tmp_path / name).read_text().splitlines()
        assert len(docs) == int(count) and all(set(d.split()) <= set(vocab) for d in docs)
    else:
        source, target, count = lines[0].split()
        pairs = list(zip(open(source).read().splitlines(), open(target).read().splitlines()))
        assert len(pairs) == int(count)
        assert all(len(s.split()) < src and len(t.split()) < tgt for s, t in pairs)


def test_config_helpers(tmp_path):
    model = {"vocab_size": 30522, "hidden_size": 768, "dropout_rate": 0.1,
             "vocab_file": "x.txt"}
    loader = {"data_processor": "BertSumCSVDataProcessor", "max_sequence_length": 1532,
              "max_cls_tokens": 50}
    trials.tiny_decoder(model)
    trials.encoder_files("bert_extractive_summarization", model, [loader], tmp_path)
    assert model["vocab_size"] == 512 and model["embedding_dropout_rate"] == 0.0
    assert model["vocab_file"] == str(tmp_path / "vocab.txt")
    assert loader["max_sequence_length"] == MSL and loader["max_cls_tokens"] == 8
    esm = {"vocab_size": 33}
    trials.tiny_decoder(esm)
    assert esm["vocab_size"] == 33
    hdf5 = {"data_processor": "BertHDF5DataProcessor", "max_sequence_length": 1026}
    trials.encoder_files("esm2", {}, [hdf5], tmp_path)
    assert "max_sequence_length" not in hdf5

    t5 = {"src_vocab_size": 32001, "extra_ids": 100, "d_model": 512, "dropout_rate": 0.1,
          "tgt_max_position_embeddings": 114}
    t5_loader = {"data_dir": str(tmp_path), "src_data_dir": "a", "src_vocab_file": "v",
                 "src_max_sequence_length": 512, "tgt_max_sequence_length": 114}
    trials.tiny_seq2seq("t5", t5, [t5_loader], tmp_path)
    assert t5["src_vocab_size"] + t5["extra_ids"] == 512 and t5["dropout_rate"] == 0.0
    assert t5["tgt_max_position_embeddings"] == 32 and "data_dir" not in t5_loader
    assert t5_loader["src_data_dir"] == str(tmp_path)
    assert (t5_loader["src_max_sequence_length"], t5_loader["tgt_max_sequence_length"]) == (64, 32)


def test_dpr_hdf5(tmp_path):
    import h5py

    writers.write_dpr_hdf5(tmp_path)
    params = json.loads((tmp_path / "data_params.json").read_text())
    assert params["data_0_features"][0] == "questions_input_ids"
    assert params["data_1_features"][0] == "ctx_input_ids"
    with h5py.File(tmp_path / "data-0.h5") as f:
        assert f.attrs["n_examples"] == 64
        questions, contexts = np.asarray(f["data_0"]), np.asarray(f["data_1"])
    assert questions.shape == (64, 3, MSL) and contexts.shape == (64, 3, 2, MSL)
    assert (questions[:, 0, 0] == 2).all() and (contexts[:, 1].sum(-1) >= 8).all()


PATCHES = 16


def _check_sample(tokens, loss_mask, labels, key_padding, first_text: int, vocab: int = 512):
    """One multimodal sample against its layout: labels the input ids shifted by one, the
    loss on the labels from ``first_text`` to the end token, padding after it."""
    length = int((key_padding == 0).sum())
    assert (key_padding[:length] == 0).all() and (key_padding[length:] == 1).all()
    assert tokens[0] == writers.MULTIMODAL_IDS["bos"] and labels[length - 1] == 2  # eos
    assert (labels[:length - 1] == tokens[1:length]).all()
    assert (tokens[length:] == 0).all() and (labels[length:] == 0).all()
    assert (np.flatnonzero(loss_mask) == np.arange(first_text, length)).all()
    text = tokens[first_text + 1:length]
    assert ((text >= 3) & (text < vocab - 1)).all()
    return length


@pytest.mark.parametrize("vsl", [False, True])
def test_llava_hdf5(tmp_path, vsl):
    import h5py
    from PIL import Image

    writers.write_llava_hdf5(tmp_path, PATCHES, vsl_features=vsl)
    for i in range(2):
        with h5py.File(tmp_path / f"data-{i}.h5") as f:
            assert f.attrs["n_examples"] == 64
            data, paths = np.asarray(f["data"]), np.asarray(f["img_path"])
        assert data.dtype == np.int32 and data.shape == (64, 6 if vsl else 4, 64)
        assert paths.dtype.kind == "S" and paths.shape == (64, 1)
        for sample, (path,) in zip(data, paths):
            tokens, loss_mask, labels, key_padding = sample[[0, 1, 2, -1]]
            # the placeholders the image's patch features replace, after the first token
            assert (tokens[1:1 + PATCHES] == 0).all()
            length = _check_sample(tokens, loss_mask, labels, key_padding, PATCHES)
            if vsl:
                span, positions = sample[3], sample[4]
                assert (span[:length] == np.arange(length - 1, -1, -1)).all()
                assert (positions[:length] == np.arange(length)).all()
                assert (span[length:] == 0).all() and (positions[length:] == 0).all()
            image = Image.open(tmp_path / "images" / path.decode("utf-8")).convert("RGB")
            assert image.size == writers.MULTIMODAL_IMAGE_SIZE


def test_multimodal_simple_hdf5(tmp_path):
    import h5py

    writers.write_multimodal_simple_hdf5(tmp_path, PATCHES)
    text_only = 0
    for i in range(2):
        with h5py.File(tmp_path / f"data-{i}.h5") as f:
            assert f.attrs["n_examples"] == 64
            assert f["img_path"].dtype == h5py.string_dtype(encoding="utf-8")
            data, paths = np.asarray(f["data"]), f["img_path"][()]
            where, has_image = np.asarray(f["img_data_loc"]), np.asarray(f["has_img"])
        assert data.dtype == np.int32 and data.shape == (64, 5, 64)
        assert paths.shape == (64, 1) and where.shape == (64, 1, PATCHES)
        for sample, (path,), (loc,), (has,) in zip(data, paths, where, has_image):
            tokens, loss_mask, labels, key_padding, modality = sample
            path = path.decode("utf-8")
            if has:
                assert (loc == np.arange(1, 1 + PATCHES)).all()
                assert (tokens[loc] == 511).all() and (tokens[loc.max() + 1:] != 511).all()
                assert (tmp_path / "images" / path).is_file()
            else:  # a text-only sample: its placeholder image scattered past the sequence
                text_only += 1
                assert path == "None" and (loc == 64).all() and (tokens != 511).all()
            assert (np.flatnonzero(modality) == (loc if has else [])).all()
            _check_sample(tokens, loss_mask, labels, key_padding, PATCHES if has else 0)
    assert text_only == 128 // 8


def test_multimodal_writers_refuse_patches_that_fill_the_sequence(tmp_path):
    with pytest.raises(ValueError, match="60 image patches"):
        writers.write_llava_hdf5(tmp_path, 60)
    with pytest.raises(ValueError, match="max_num_img"):
        writers.write_multimodal_simple_hdf5(tmp_path, PATCHES, max_num_img=0)


def _vit(hidden=1024):
    return {"name": "ViTModel", "hidden_size": hidden, "num_hidden_layers": 24,
            "num_heads": 16, "filter_size": 4096, "image_size": [336, 336],
            "patch_size": [14, 14], "dropout_rate": 0.1, "embedding_dropout_rate": 0.1}


def _loader(processor):
    return {"data_processor": processor, "data_dir": "./shipped", "img_data_dir": "./images",
            "image_data_size": [3, 336, 336], "use_worker_cache": True,
            "transforms": [{"name": "expand_to_square", "background_color": [122, 116, 104]},
                           {"name": "resize", "size": 336, "interpolation": "bicubic"},
                           {"name": "random_horizontal_flip"},
                           {"name": "center_crop", "size": 336}, {"name": "to_tensor"}]}


def _text():
    return {"name": "LlamaModel", "vocab_size": 32000, "hidden_size": 4096, "num_heads": 32,
            "rotary_dim": 128, "max_position_embeddings": 2048, "dropout_rate": 0.0}


def test_tiny_multimodal(tmp_path):
    ffn = {"name": "FeedForwardNetwork", "input_unit": 1024, "layers_units": [4096, 4096],
           "layers_activation": ["gelu", None]}
    llava = {"image_model": _vit(), "text_model": _text(), "projector": {"image_model": ffn}}
    loaders = [_loader("LlavaHDF5MapDataProcessor")]
    trials.tiny_multimodal("llava", llava, loaders, tmp_path)
    assert llava["image_model"]["hidden_size"] == 64 and llava["image_model"]["dropout_rate"] == 0
    assert llava["text_model"]["vocab_size"] == 512 and llava["text_model"]["rotary_dim"] == 16
    assert ffn["input_unit"] == 64 and ffn["layers_units"] == [64, 64]
    assert trials.image_patches("llava", llava) == PATCHES
    loader = loaders[0]
    assert loader["img_data_dir"] == str(tmp_path / "images")
    assert loader["image_data_size"] == [3, 32, 32] and not loader["use_worker_cache"]
    assert [t["name"] for t in loader["transforms"]] == ["expand_to_square", "resize",
                                                          "center_crop", "to_tensor"]
    assert loader["transforms"][1]["size"] == [32, 32]

    simple = {"image_model_list": {"image_models": [{"image_encoder": _vit()}],
                                   "global_image_projection": dict(ffn, input_unit=1024)},
              "text_model": _text()}
    trials.tiny_multimodal("multimodal_simple", simple, [], tmp_path)
    encoder = simple["image_model_list"]["image_models"][0]["image_encoder"]
    assert encoder["image_size"] == [32, 32] and encoder["patch_size"] == [8, 8]
    assert simple["image_model_list"]["global_image_projection"]["input_unit"] == 64
    assert trials.image_patches("multimodal_simple", simple) == PATCHES


def test_trainer_params_for_llava(tmp_path):
    """A Trainer configuration of LLaVA's shape: the model shrunk by tiny_multimodal only (not
    as a decoder), every checkpoint the trial reads kept, the loaders at the trial's images."""
    import yaml

    ffn = {"name": "FeedForwardNetwork", "input_unit": 1024, "layers_units": [4096, 4096],
           "layers_activation": ["gelu", None]}
    loader = _loader("LlavaHDF5MapDataProcessor")
    shipped = {"trainer": {
        "init": {"model": {"name": "llava", "image_model": _vit(), "text_model": _text(),
                           "projector": {"image_model": ffn}, "freeze": ["^image_model"]},
                 "callbacks": [{"KeepNCheckpoints": {"n": 3}}, {"ComputeNorm": {}}],
                 "schedulers": [{"LinearLR": {"initial_learning_rate": 0.0,
                                              "end_learning_rate": 0.001, "total_iters": 66}}]},
        "fit": {"train_dataloader": dict(loader, batch_size=220, num_workers=8),
                "val_dataloader": dict(loader, batch_size=220)}}}
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(shipped))
    params = trials.trainer_params_for("llava", path, tmp_path / "data", 6, "mixed-bf16")
    init = params["trainer"]["init"]
    assert init["callbacks"] == [{"ComputeNorm": {}}]
    assert init["checkpoint"] == {"steps": 2, "save_initial_checkpoint": True}
    model = init["model"]
    assert "vocab_size" not in model and model["freeze"] == ["^image_model"]
    assert model["text_model"]["hidden_size"] == 64 and model["image_model"]["hidden_size"] == 64
    for loader in (params["trainer"]["fit"]["train_dataloader"],
                   params["trainer"]["validate"]["val_dataloader"]):
        assert loader["data_dir"] == str(tmp_path / "data")
        assert loader["img_data_dir"] == str(tmp_path / "data" / "images")
        assert (loader["batch_size"], loader["num_workers"], loader["shuffle"]) == (8, 0, False)


def test_severstal(tmp_path):
    """Each image's run-length-encoded defect (one-based, down each column, as the Severstal
    processor decodes it) is the bright rectangle in its image."""
    from PIL import Image

    writers.write_severstal(tmp_path, count=5)
    height, width = writers.SEVERSTAL_SHAPE
    found = rows(tmp_path / "train.csv")
    assert [r["ImageId"] for r in found] == [f"{i:05d}.jpg" for i in range(5)]
    assert {r["ClassId"] for r in found} == {"3"}
    for r in found:
        numbers = [int(x) for x in r["EncodedPixels"].split()]
        mask = np.zeros(height * width, dtype=bool)
        for start, length in zip(numbers[::2], numbers[1::2]):
            mask[start - 1:start - 1 + length] = True
        mask = mask.reshape(width, height).T
        image = np.asarray(Image.open(tmp_path / "train_images" / r["ImageId"]).convert("L"))
        assert image.shape == (height, width)
        assert image[mask].mean() > image[~mask].mean() + 60


def test_legacy_families_are_named_by_their_folders(tmp_path):
    """A Release 2.0/2.1 checkout (``modelzoo/`` at its top): a family per ``run.py``, named
    without the transformers/vision/pytorch/fine_tuning levels; each maps to its folder and its
    shipped configuration."""
    code = tmp_path / "Release_2.0.2" / "modelzoo"
    folders = ["fc_mnist/pytorch", "transformers/pytorch/gpt2",
               "transformers/pytorch/bert/fine_tuning/token_classifier", "vision/pytorch/unet"]
    for folder in folders:
        (code / folder).mkdir(parents=True)
        (code / folder / "run.py").write_text("")
    release = tmp_path / "Release_2.0.2"
    assert trials.is_legacy_release(release) and not trials.is_trainer_release(release)
    assert trials.families_legacy(release) == ["bert_token_classifier", "fc_mnist", "gpt2",
                                               "unet"]
    run_py, shipped, root = trials.program_paths(release, "bert_token_classifier")
    assert run_py == code / folders[2] / "run.py" and root == release
    assert shipped == code / folders[2] / "configs" / "bert_base_ner_bc5cdr_chem.yaml"
    table = trials.families_table("Release_2.0.2", [], release)
    assert [line.split(" | ")[0] for line in table.splitlines()[2:6]] == [
        "| bert_token_classifier", "| fc_mnist", "| gpt2", "| unet"]
    assert table.endswith("0 of 4 families train, evaluate and resume on CSX equal to CPU "
                          "(none); 0 of 4 equal to the real package (none).")


def test_half_flag_follows_the_release(tmp_path):
    """Release 2.0 picks the half dtype with use_bfloat16; from 2.1 on half_dtype.py refuses it
    for fp16_type, and the trial's configuration uses the key its release reads."""
    for name, text in (("Release_2.0.2", "use_bfloat16 = False\n"),
                       ("Release_2.1.1", 'raise KeyError("use fp16_type")\n')):
        folder = tmp_path / name / "modelzoo" / "common" / "pytorch"
        folder.mkdir(parents=True)
        (folder / "half_dtype.py").write_text(text)
    assert trials.half_flag(tmp_path / "Release_2.0.2") == "use_bfloat16"
    assert trials.half_flag(tmp_path / "Release_2.1.1") == "fp16_type"
    shipped = tmp_path / "params.yaml"
    shipped.write_text("model: {}\nrunconfig: {}\ntrain_input: {}\neval_input: {}\n")
    for flag, other, value in (("use_bfloat16", "fp16_type", True),
                               ("fp16_type", "use_bfloat16", "bfloat16")):
        written = trials.params_for("fc_mnist", shipped, tmp_path, 6, "mixed-bf16", False, flag)
        assert written["model"][flag] == value and other not in written["model"]
