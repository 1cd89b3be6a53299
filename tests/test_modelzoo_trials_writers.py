"""The data writers of tools/modelzoo_trials.py: each writes the layout its Model Zoo data
processor reads (read back here the way the processor reads it, without the Model Zoo), and
the configuration helpers point a family's sections at those files."""

import csv
import json

import numpy as np
import pytest

from tools import modelzoo_trials as trials

MSL = trials.ENCODER_MSL


def meta(folder):
    return {line.split()[0]: int(line.split()[-1])
            for line in (folder / "meta.dat").read_text().splitlines()}


def rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_dynamic_mask_csv(tmp_path):
    trials.write_bert_data(tmp_path, "BertCSVDynamicMaskDataProcessor")
    vocab = (tmp_path / "vocab.txt").read_text().split()
    assert len(vocab) == 512 and vocab[:5] == trials.BERT_SPECIAL
    assert meta(tmp_path) == {"data-0.csv": 64, "data-1.csv": 64}
    for row in rows(tmp_path / "data-0.csv"):
        tokens, segments = eval(row["tokens"]), eval(row["segment_ids"])
        assert len(tokens) == len(segments) <= MSL
        assert tokens[0] == "[CLS]" and tokens[-1] == "[SEP]" and tokens.count("[SEP]") == 2
        assert set(tokens) <= set(vocab) and row["is_random_next"] in ("0", "1")


@pytest.mark.parametrize("special", [None, trials.ESM2_SPECIAL])
def test_premasked_csv_and_hdf5(tmp_path, special):
    import h5py

    trials.write_bert_data(tmp_path, "BertHDF5DataProcessor",
                           vocab=33 if special else 512, special=special)
    sp = {"pad": 0, "mask": 4, "low": 5, "high": 512, **(special or {})}
    csv_rows = rows(tmp_path / "data-1.csv")
    with h5py.File(tmp_path / "data-1.h5") as f:
        data, labels = np.asarray(f["data"]), np.asarray(f["labels"])
    assert data.shape == (64, 2, MSL) and labels.shape == (64, 3, trials.MAX_PREDICTIONS)
    for row, d, lab in zip(csv_rows, data, labels):
        ids, positions = np.array(eval(row["input_ids"])), np.array(eval(row["masked_lm_positions"]))
        assert (ids == d[0]).all() and (np.array(eval(row["attention_mask"])) == d[1]).all()
        assert (ids[positions] == sp["mask"]).all() and (lab[1] == positions).all()
        assert ((lab[0] >= sp["low"]) & (lab[0] < sp["high"])).all()
        assert (ids[d[1] == 0] == sp["pad"]).all()
    params = json.loads((tmp_path / "data_params.json").read_text())
    assert params["dataset"] == {"training_objective": "mlm", "mlm_with_gather": True}


def test_sst2_ner_and_bertsum(tmp_path):
    trials.write_bert_data(tmp_path / "sst2", "SST2DataProcessor")
    with open(tmp_path / "sst2" / "dev.tsv") as f:
        dev = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    assert len(dev) == 64 and {r["label"] for r in dev} <= {"0", "1"}

    trials.write_bert_data(tmp_path / "ner", "BertTokenClassifierDataProcessor")
    label2id = json.loads((tmp_path / "ner" / "label2id.json").read_text())
    assert len(label2id) == 7 and label2id["[PAD]"] == 0
    for row in rows(tmp_path / "ner" / "data-0.csv"):
        tokens, labels = row["tokens"].split(), row["labels"].split()
        assert len(tokens) == len(labels) <= MSL and set(labels) <= set(label2id)

    trials.write_bert_data(tmp_path / "sum", "BertSumCSVDataProcessor")
    for row in rows(tmp_path / "sum" / "data-0.csv"):
        ids, labels, segments, cls = (eval(row[k]) for k in (
            "input_token_ids", "labels", "segment_ids", "cls_indices"))
        assert len(ids) == len(segments) <= MSL
        assert len(cls) == len(labels) <= trials.MAX_CLS_TOKENS
        assert all(ids[i] == 2 for i in cls)  # [CLS]


@pytest.mark.parametrize("program", ["t5", "transformer"])
def test_seq2seq_text(tmp_path, program):
    extra = 100 if program == "t5" else 0
    trials.write_seq2seq_data(tmp_path, program, extra_ids=extra)
    vocab = (tmp_path / "vocab.txt").read_text().split()
    assert vocab[:4] == trials.SEQ2SEQ_SPECIAL and len(vocab) + extra == 512
    lines = (tmp_path / "meta.dat").read_text().splitlines()
    assert len(lines) == 2
    src, tgt = trials.SEQ2SEQ_MSL[program]
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

    trials.write_dpr_hdf5(tmp_path)
    params = json.loads((tmp_path / "data_params.json").read_text())
    assert params["data_0_features"][0] == "questions_input_ids"
    assert params["data_1_features"][0] == "ctx_input_ids"
    with h5py.File(tmp_path / "data-0.h5") as f:
        assert f.attrs["n_examples"] == 64
        questions, contexts = np.asarray(f["data_0"]), np.asarray(f["data_1"])
    assert questions.shape == (64, 3, MSL) and contexts.shape == (64, 3, 2, MSL)
    assert (questions[:, 0, 0] == 2).all() and (contexts[:, 1].sum(-1) >= 8).all()
