"""The data writers of tools/modelzoo_trials.py: each writes, offline and small, the files one
of the Model Zoo's data processors reads, in the layout the Model Zoo's own preprocessing
writes them (MNIST's idx-ubyte files, GPT and DPR token HDF5 files, the BERT families' CSV,
TSV and HDF5 files, T5's and the Transformer's token text files, ImageNet-style image folders,
DiT's VAE latents, and LLaVA's and the multimodal_simple model's token files with their image
folders). The configuration that points a family at them is modelzoo_trials.py's."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]


def write_mnist(folder: Path, n_train: int = 1500) -> None:
    """MNIST idx-ubyte files from the 8x8 digits, upscaled x3 to 24x24 and padded to 28x28."""
    raw = folder / "MNIST" / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    digits = np.load(REPO / "examples" / "digits.npz")
    images = digits["images"].astype(np.float32) * (255.0 / max(1, digits["images"].max()))
    images = np.pad(np.kron(images, np.ones((3, 3), np.float32)), ((0, 0), (2, 2), (2, 2)))
    images, labels = images.astype(np.uint8), digits["labels"].astype(np.uint8)

    def write(name, array, magic):
        with open(raw / name, "wb") as f:
            f.write(struct.pack(">I", magic) + struct.pack(f">{array.ndim}I", *array.shape))
            f.write(array.tobytes())

    write("train-images-idx3-ubyte", images[:n_train], 0x803)
    write("train-labels-idx1-ubyte", labels[:n_train], 0x801)
    write("t10k-images-idx3-ubyte", images[n_train:], 0x803)
    write("t10k-labels-idx1-ubyte", labels[n_train:], 0x801)


def write_gpt_hdf5(folder: Path, files: int = 2, per_file: int = 64, msl: int = 64,
                   vocab: int = 512, pairs: bool = False) -> None:
    """Token files as the Model Zoo's GPT HDF5 processors read them: ``data`` [n, 3, msl]
    (input ids, attention mask, labels: the ids shifted by one) and the ``n_examples``
    attribute. ``pairs``: DPO's [n, 6, msl], a chosen and a rejected sequence, named in
    ``data_params.json`` as its HDF5 conversion writes them."""
    import h5py

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for i in range(files):
        rows = []
        for _ in range(2 if pairs else 1):
            tokens = rng.integers(0, vocab, size=(per_file, msl + 1), dtype=np.int32)
            rows += [tokens[:, :-1], np.ones((per_file, msl), np.int32), tokens[:, 1:]]
        with h5py.File(folder / f"data-{i}.h5", "w") as f:
            f.attrs["n_examples"] = per_file
            f.create_dataset("data", data=np.stack(rows, 1))
    if pairs:
        features = [f"{side}_{name}" for side in ("chosen", "rejected")
                    for name in ("input_ids", "attention_mask", "labels")]
        (folder / "data_params.json").write_text(json.dumps({"features": features}))


ENCODER_MSL = 64
"""The sequence length of the encoder families' files (their models' position embeddings are
shrunk to it)."""

MAX_PREDICTIONS = 10
"""Masked tokens per sequence in the pre-masked files (15% of 64, rounded up)."""

MAX_CLS_TOKENS = 8
"""Sentences per document in BertSumCSVDataProcessor's files."""

BERT_SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
"""The first entries of the vocabulary written for the BERT families: the tokens their data
processors look up (padding id 0, as their ``*_pad_id`` defaults)."""

NER_LABELS = ["[PAD]", "O", "B-Chemical", "I-Chemical", "X", "[CLS]", "[SEP]"]
"""BertTokenClassifierDataProcessor's label2id.json: as many labels as bc5cdr-chem's
``num_classes`` (7), the padding label first (its ``labels_pad_id`` is the id of [PAD])."""


def bert_vocab(vocab: int = 512) -> list[str]:
    """A WordPiece vocabulary of ``vocab`` entries: BERT_SPECIAL, then the words ``w5``,
    ``w6``, ... (lower case, so ``do_lower`` leaves them as they are, and whole words to
    the FullTokenizer)."""
    return BERT_SPECIAL + [f"w{i}" for i in range(len(BERT_SPECIAL), vocab)]


def _write_csv(folder: Path, name: str, header: list[str], rows: list[list]) -> None:
    import csv

    with open(folder / name, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(rows)


def _write_meta(folder: Path, counts: dict) -> None:
    """The ``meta.dat`` the CSV processors of the BERT families read: one ``file count`` line
    per file."""
    (folder / "meta.dat").write_text("".join(f"{n} {c}\n" for n, c in counts.items()))


def write_bert_data(folder: Path, processor: str, files: int = 2, per_file: int = 64,
                    vocab: int = 512, msl: int = ENCODER_MSL, special: dict | None = None) -> None:
    """The files ``processor`` (a data processor of the BERT families) reads, of random
    sentences over :func:`bert_vocab`'s words, written in the layout its Model Zoo
    preprocessing writes them, ``files`` files of ``per_file`` samples where it reads a list
    of files (each listed in ``meta.dat``), and ``vocab.txt``, ``label2id.json`` beside them:

    - BertCSVDynamicMaskDataProcessor: ``tokens`` (a Python list of ``[CLS] A [SEP] B [SEP]``),
      ``segment_ids``, ``is_random_next``; it masks them as it reads them;
    - BertCSVDataProcessor: pre-masked ``input_ids``, ``masked_lm_weights``,
      ``masked_lm_positions``, ``attention_mask``, ``labels`` (MAX_PREDICTIONS gathered);
      ``special`` gives its ids (``cls``, ``sep``, ``pad``, ``mask``, and the tokens drawn from
      ``low`` to ``high``; ESM-2's amino acids);
    - BertHDF5DataProcessor: the same samples in "sample" HDF5 files, ``data`` [n, 2, msl]
      (input ids, attention mask) and ``labels`` [n, 3, MAX_PREDICTIONS] (labels, positions,
      mask), with the ``data_params.json`` that says they are gathered MLM samples;
    - SST2DataProcessor: ``train.tsv`` and ``dev.tsv`` (``sentence``, ``label``);
    - BertTokenClassifierDataProcessor: ``tokens`` and ``labels``, space separated, with
      NER_LABELS in ``label2id.json``;
    - BertSumCSVDataProcessor: ``input_token_ids``, ``labels``, ``segment_ids``,
      ``cls_indices`` (lists, a document of up to MAX_CLS_TOKENS ``[CLS] ... [SEP]``
      sentences)."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    words = bert_vocab(vocab)
    (folder / "vocab.txt").write_text("\n".join(words) + "\n")
    (folder / "label2id.json").write_text(json.dumps({k: i for i, k in enumerate(NER_LABELS)}))
    first = len(BERT_SPECIAL)

    def sentence(n):
        return [words[i] for i in rng.integers(first, vocab, size=n)]

    if processor == "SST2DataProcessor":
        for name, n in (("train", files * per_file), ("dev", per_file)):
            lines = ["sentence\tlabel"] + [f"{' '.join(sentence(int(rng.integers(4, msl - 2))))}"
                                           f"\t{int(rng.integers(0, 2))}" for _ in range(n)]
            (folder / f"{name}.tsv").write_text("\n".join(lines) + "\n")
        return
    counts, h5_rows = {}, []
    for i in range(files):
        rows = []
        for _ in range(per_file):
            if processor == "BertCSVDynamicMaskDataProcessor":
                a, b = int(rng.integers(4, msl // 2 - 2)), int(rng.integers(4, msl // 2 - 1))
                tokens = ["[CLS]", *sentence(a), "[SEP]", *sentence(b), "[SEP]"]
                rows.append([str(tokens), str([0] * (a + 2) + [1] * (b + 1)),
                             int(rng.integers(0, 2))])
            elif processor == "BertTokenClassifierDataProcessor":
                n = int(rng.integers(4, msl - 2))
                labels = [NER_LABELS[j] for j in rng.integers(1, 5, size=n)]
                rows.append([" ".join(["[CLS]", *sentence(n), "[SEP]"]),
                             " ".join(["[CLS]", *labels, "[SEP]"])])
            elif processor == "BertSumCSVDataProcessor":
                ids, segments, cls, labels = [], [], [], []
                for k in range(int(rng.integers(2, MAX_CLS_TOKENS + 1))):
                    n = int(rng.integers(2, msl // MAX_CLS_TOKENS - 1))
                    cls.append(len(ids))
                    ids += [2, *rng.integers(first, vocab, size=n).tolist(), 3]
                    segments += [k % 2] * (n + 2)
                    labels.append(int(rng.integers(0, 2)))
                rows.append([str(ids), str(labels), str(segments), str(cls)])
            else:  # pre-masked: BertCSVDataProcessor, BertHDF5DataProcessor
                sp = {"cls": 2, "sep": 3, "pad": 0, "mask": 4, "low": first, "high": vocab,
                      **(special or {})}
                n = int(rng.integers(msl // 2, msl - 1))
                tokens = [sp["cls"], *rng.integers(sp["low"], sp["high"], size=n).tolist(),
                          sp["sep"]]
                ids = np.full(msl, sp["pad"], np.int32)
                ids[:len(tokens)] = tokens
                mask = np.zeros(msl, np.int32)
                mask[:len(tokens)] = 1
                positions = np.zeros(MAX_PREDICTIONS, np.int32)
                chosen = np.sort(rng.choice(np.arange(1, len(tokens) - 1),
                                            size=MAX_PREDICTIONS, replace=False))
                positions[:] = chosen
                labels = ids[positions].copy()
                weights = np.ones(MAX_PREDICTIONS, np.int32)
                ids[positions] = sp["mask"]
                rows.append([str(ids.tolist()), str(weights.tolist()), str(positions.tolist()),
                             str(mask.tolist()), str(labels.tolist())])
                h5_rows.append((ids, mask, labels, positions, weights))
        name = f"data-{i}.csv"
        header = {"BertCSVDynamicMaskDataProcessor": ["tokens", "segment_ids", "is_random_next"],
                  "BertTokenClassifierDataProcessor": ["tokens", "labels"],
                  "BertSumCSVDataProcessor": ["input_token_ids", "labels", "segment_ids",
                                              "cls_indices"]}.get(
            processor, ["input_ids", "masked_lm_weights", "masked_lm_positions",
                        "attention_mask", "labels"])
        _write_csv(folder, name, header, rows)
        counts[name] = per_file
    _write_meta(folder, counts)
    if h5_rows:
        import h5py

        for i in range(files):
            part = h5_rows[i * per_file:(i + 1) * per_file]
            with h5py.File(folder / f"data-{i}.h5", "w") as f:
                f.attrs["n_examples"] = per_file
                f.create_dataset("data", data=np.stack([np.stack(r[:2]) for r in part]))
                f.create_dataset("labels", data=np.stack([np.stack(r[2:]) for r in part]))
        (folder / "data_params.json").write_text(json.dumps(
            {"dataset": {"training_objective": "mlm", "mlm_with_gather": True}}))


ESM2_SPECIAL = {"cls": 0, "pad": 1, "sep": 2, "mask": 32, "low": 4, "high": 24}
"""ESM-2's token ids (its 33-token vocabulary: <cls>, <pad>, <eos>, <unk>, the 20 common amino
acids from 4, ..., <mask> 32; its configurations' ``pad_token_id`` and ``mask_token_id``)."""


def write_dpr_hdf5(folder: Path, files: int = 2, per_file: int = 64, msl: int = ENCODER_MSL,
                   vocab: int = 512, contexts: int = 2) -> None:
    """Question/context files as DPRHDF5DataProcessor reads them, in the layout the Model
    Zoo's DPR conversion writes: ``data_0`` [n, 3, msl] (the question's input ids, attention
    mask, token types) and ``data_1`` [n, 3, ``contexts``, msl] (its positive and hard negative
    contexts'), the ``n_examples`` attribute, and the ``data_params.json`` that names the
    features of each group. Each sequence is ``[CLS] ... [SEP]`` over :func:`bert_vocab`'s
    ids."""
    import h5py

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    first = len(BERT_SPECIAL)

    def sequences(shape):
        ids = np.zeros((*shape, msl), np.int32)
        mask = np.zeros((*shape, msl), np.int32)
        for index in np.ndindex(*shape):
            n = int(rng.integers(8, msl - 1))
            ids[index][:n] = [2, *rng.integers(first, vocab, size=n - 2), 3]
            mask[index][:n] = 1
        return np.stack([ids, mask, np.zeros_like(ids)], axis=1)

    for i in range(files):
        with h5py.File(folder / f"data-{i}.h5", "w") as f:
            f.attrs["n_examples"] = per_file
            f.create_dataset("data_0", data=sequences((per_file,)))
            f.create_dataset("data_1", data=sequences((per_file, contexts)))
    (folder / "data_params.json").write_text(json.dumps({
        "data_0_features": [f"questions_{k}" for k in ("input_ids", "attention_mask",
                                                       "token_type_ids")],
        "data_1_features": [f"ctx_{k}" for k in ("input_ids", "attention_mask",
                                                 "token_type_ids")]}))


SEQ2SEQ_SPECIAL = ["<pad>", "</s>", "<unk>", "<s>"]
"""The tokens T5DynamicDataProcessor (and TransformerDynamicDataProcessor, built on it) look
up, at the ids of T5's SentencePiece vocabulary (padding 0, end 1, unknown 2), then <s>."""


SEQ2SEQ_MSL = {"t5": (64, 32), "transformer": (64, 64)}
"""(source, target) sequence lengths: T5's span corruption of a 64-token input leaves targets
of at most 17 tokens, its configurations' 114 of 512 a similar share."""


def write_seq2seq_data(folder: Path, program: str, files: int = 2, per_file: int = 64,
                       vocab: int = 512, extra_ids: int = 0) -> None:
    """Text files as T5DynamicDataProcessor and TransformerDynamicDataProcessor read them: one
    document (T5) or sentence (Transformer: a source file and its target file side by side)
    a line, its tokens separated by spaces; ``meta.dat`` naming each file (the Transformer's:
    ``source target count``, absolute paths) and its lines; ``vocab.txt`` of ``vocab`` tokens
    less the ``extra_ids`` the processor adds after them (T5's sentinels), SEQ2SEQ_SPECIAL
    first, then the words ``w4``, ``w5``, ..."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    vocab -= extra_ids
    words = SEQ2SEQ_SPECIAL + [f"w{i}" for i in range(len(SEQ2SEQ_SPECIAL), vocab)]
    (folder / "vocab.txt").write_text("\n".join(words) + "\n")
    src, tgt = SEQ2SEQ_MSL[program]

    def line(n):
        return " ".join(words[i] for i in rng.integers(len(SEQ2SEQ_SPECIAL), vocab, size=n))

    meta = []
    for i in range(files):
        if program == "t5":
            lines = [line(int(rng.integers(src, 2 * src))) for _ in range(per_file)]
            (folder / f"data-{i}.txt").write_text("\n".join(lines) + "\n")
            meta.append(f"data-{i}.txt {per_file}")
        else:
            pairs = [(line(int(rng.integers(4, src - 2))), line(int(rng.integers(4, tgt - 2))))
                     for _ in range(per_file)]
            for side, k in (("src", 0), ("tgt", 1)):
                (folder / f"data-{i}.{side}").write_text("\n".join(p[k] for p in pairs) + "\n")
            meta.append(f"{folder / f'data-{i}.src'} {folder / f'data-{i}.tgt'} {per_file}")
    (folder / "meta.dat").write_text("\n".join(meta) + "\n")


VISION_CLASSES = 4
"""Classes of the trials' image folders (and of the shrunk classifiers)."""


def write_image_folders(folder: Path, splits: dict | None = None, size: int = 40,
                        classes: int = VISION_CLASSES) -> None:
    """ImageNet-style image folders as torchvision's ``ImageNet`` (ImageNet1KProcessor) reads
    them: ``SPLIT/WNID/*.png`` for each split and the ``meta.bin`` that maps each WNID to its
    class names. ``splits``: images per class of each split (train 16, val 8: 8 training
    batches of 8, more than a trial's 6 steps, and the 4 batches of its evaluation). Each
    class's images are noise about a colour of its own, so a classifier has something to
    learn; unshuffled, the folders give batches of one class at a time."""
    import torch
    from PIL import Image

    splits = splits or {"train": 16, "val": 8}
    rng = np.random.default_rng(0)
    wnids = [f"n{i:08d}" for i in range(classes)]
    colours = rng.integers(32, 224, size=(classes, 3))
    val_wnids = []
    for split, per_class in splits.items():
        for label, wnid in enumerate(wnids):
            (folder / split / wnid).mkdir(parents=True, exist_ok=True)
            for i in range(per_class):
                noise = rng.normal(0, 40, size=(size, size, 3))
                pixels = np.clip(colours[label] + noise, 0, 255).astype(np.uint8)
                Image.fromarray(pixels).save(folder / split / wnid / f"{wnid}_{i:04d}.png")
                val_wnids += [wnid] * (split == "val")
    torch.save(({w: (f"class {i}",) for i, w in enumerate(wnids)}, val_wnids),
               folder / "meta.bin")


LATENT = {"latent_size": [8, 8], "latent_channels": 4}
"""The VAE latents of the DiT trials: 4 channels of 8x8 (a 64x64 image under the shipped VAE's
downsampling by 8), 16 patches of 2x2."""

LATENT_FOLDERS = ("latents", "latents_hflipped")
"""The DiT trials' two latent folders, as the shipped configuration reads the latents of the
images and of their mirror images."""


def write_latent_folders(folder: Path, splits: dict | None = None,
                         classes: int = VISION_CLASSES) -> None:
    """VAE latent files as DiffusionLatentImageNet1KProcessor reads them and the Model Zoo's
    ``create_imagenet_latents.py`` writes them: ``SPLIT/WNID/*.npz`` with ``vae_output``
    [2 * channels, height, width] (the VAE's mean and log-variance, from which the processor
    samples the latent), ``label``, ``src_path`` and ``dest_path``; the mirrored folder holds
    the same latents flipped along the width. ``splits``: latents per class (train 16, val 8,
    as :func:`write_image_folders`)."""
    splits = splits or {"train": 16, "val": 8}
    rng = np.random.default_rng(0)
    channels, (height, width) = LATENT["latent_channels"], LATENT["latent_size"]
    means = rng.normal(0, 4, size=(classes, channels, 1, 1))
    for split, per_class in splits.items():
        for label in range(classes):
            wnid = f"n{label:08d}"
            for i in range(per_class):
                mean = means[label] + rng.normal(0, 2, size=(channels, height, width))
                logvar = np.full((channels, height, width), -4.0)
                output = np.concatenate([mean, logvar]).astype(np.float32)
                for name, latent in zip(LATENT_FOLDERS, (output, output[..., ::-1])):
                    path = folder / name / split / wnid / f"{wnid}_{i:04d}.npz"
                    path.parent.mkdir(parents=True, exist_ok=True)
                    np.savez(path, src_path=str(path.with_suffix(".JPEG")), dest_path=str(path),
                             label=np.int64(label), vae_output=np.ascontiguousarray(latent))


def write_vision_data(program: str, data: Path) -> None:
    """The data ``program``'s shipped data processor reads."""
    if program == "dit":
        write_latent_folders(data)
    else:
        write_image_folders(data)


UNET_IMAGE = (32, 32)
"""The (height, width) the UNet trials resize Severstal's 256x1600 images and masks to."""

SEVERSTAL_SHAPE = (256, 1600)
"""(height, width) of a Severstal steel image: the size the data processor decodes masks at."""


def write_severstal(folder: Path, count: int = 100, class_id: int = 3) -> None:
    """Severstal steel-defect files as SeverstalBinaryClassDataProcessor reads them:
    ``train_images/*.jpg`` (grayscale, SEVERSTAL_SHAPE) and ``train.csv`` (ImageId, ClassId,
    EncodedPixels: the defect's pixels run-length encoded, numbered down each column, one-based).
    Each image's defect is a bright rectangle of its own on noise, so a segmenter has something
    to learn."""
    from PIL import Image

    rng = np.random.default_rng(0)
    height, width = SEVERSTAL_SHAPE
    (folder / "train_images").mkdir(parents=True, exist_ok=True)
    rows = []
    for i in range(count):
        top, left = int(rng.integers(0, height // 2)), int(rng.integers(0, width // 2))
        bottom, right = top + int(rng.integers(16, height // 2)), \
            left + int(rng.integers(64, width // 2))
        pixels = rng.normal(80, 20, size=(height, width))
        pixels[top:bottom, left:right] += 100
        name = f"{i:05d}.jpg"
        Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(
            folder / "train_images" / name, quality=95)
        runs = " ".join(f"{column * height + top + 1} {bottom - top}"
                        for column in range(left, right))
        rows.append([name, class_id, runs])
    _write_csv(folder, "train.csv", ["ImageId", "ClassId", "EncodedPixels"], rows)


# Multimodal families: token HDF5 files beside a folder of the images they name

MULTIMODAL_MSL = 64
"""The sequence length of the multimodal token files (the text decoder's position embeddings
are shrunk to it)."""

MULTIMODAL_IDS = {"pad": 0, "bos": 1, "eos": 2}
"""The Llama tokenizer's ids the multimodal preprocessing writes: padding 0 (its
``pad_id``), beginning 1, end 2; caption tokens are drawn from 3 up to the image token."""

MULTIMODAL_IMAGE_SIZE = (40, 28)
"""(width, height) of the images written: not square, so the processors' ``expand_to_square``
transform pads them before they are resized to the model's image size."""


def write_caption_images(folder: Path, count: int, classes: int = VISION_CLASSES,
                         per_folder: int = 64) -> list[tuple[str, int]]:
    """``count`` PNG images under ``folder`` in LLaVA-Pretrain's layout (numbered images in
    numbered subfolders, ``00000/000000000.png``), each noise about a colour of its class as
    :func:`write_image_folders`'; the (path relative to ``folder``, class) of each. The
    classes cycle 0, 1, ..., so every batch holds several."""
    from PIL import Image

    rng = np.random.default_rng(1)
    colours = rng.integers(32, 224, size=(classes, 3))
    width, height = MULTIMODAL_IMAGE_SIZE
    written = []
    for k in range(count):
        label = k % classes
        path = f"{k // per_folder:05d}/{k:09d}.png"
        (folder / path).parent.mkdir(parents=True, exist_ok=True)
        noise = rng.normal(0, 40, size=(height, width, 3))
        Image.fromarray(np.clip(colours[label] + noise, 0, 255).astype(np.uint8)).save(
            folder / path)
        written.append((path, label))
    return written


def caption(rng, label: int, length: int, vocab: int, classes: int = VISION_CLASSES,
            first: int = 3) -> list[int]:
    """``length`` caption tokens of an image of class ``label``: drawn from the class's own
    band of the ids ``first`` ... ``vocab - 1`` (the last id is the image token), so a model
    that sees the image can predict them."""
    band = (vocab - 1 - first) // classes
    low = first + label * band
    return rng.integers(low, low + band, size=length).tolist()


def _check_fits(patches: int, msl: int) -> None:
    if patches + 8 > msl:
        raise ValueError(f"{patches} image patches leave fewer than 8 of the {msl} tokens of a "
                         f"sequence to the beginning token and a caption: shorten the patches "
                         f"or lengthen the sequence")


def write_llava_hdf5(folder: Path, num_patches: int, vsl_features: bool = False,
                     files: int = 2, per_file: int = 64, msl: int = MULTIMODAL_MSL,
                     vocab: int = 512) -> None:
    """LLaVA phase-1 samples (an image and its caption) as LlavaHDF5MapDataProcessor reads
    them, in the layout the Model Zoo's ``LlavaPhaseOne`` HDF5 preprocessing writes: ``files``
    "sample" files ``data-*.h5`` of ``per_file`` samples, each with ``data`` [n, 4, msl] int32
    (input ids, loss mask, labels, key padding mask) and ``img_path`` [n, 1] (fixed-length
    bytes, relative to ``images/``), and the ``n_examples`` attribute; the images in
    ``folder / "images"`` (:func:`write_caption_images`).

    A sample's tokens are ``[bos] + [pad] * num_patches + caption + [eos]`` (the model puts the
    image's patch features in place of the ``num_patches`` placeholders after the first
    token); its input ids all but the last, its labels all but the first; the loss counts the
    labels from the last placeholder on (the caption and its end); the key padding mask is 1 on
    the padding after the sample.

    ``vsl_features``: Release 2.2's processor, which reads six features, ``attention_span``
    and ``position_ids`` between the labels and the key padding mask, as the Model Zoo's VSL
    preprocessing writes them for one sample a sequence (each key's span the tokens after it in
    its sample, counting down to 0; positions 0, 1, ...; both 0 on the padding). Release 2.2's
    own ``LlavaPhaseOne`` preprocessing writes the four features only, which that processor
    cannot read (it indexes feature 5)."""
    import h5py

    _check_fits(num_patches, msl)
    folder.mkdir(parents=True, exist_ok=True)
    images = write_caption_images(folder / "images", files * per_file)
    rng = np.random.default_rng(0)
    ids = MULTIMODAL_IDS
    for i in range(files):
        rows, paths = [], []
        for path, label in images[i * per_file:(i + 1) * per_file]:
            text = caption(rng, label, int(rng.integers(4, msl - num_patches - 1)), vocab)
            tokens = [ids["bos"], *[ids["pad"]] * num_patches, *text, ids["eos"]]
            length = len(tokens) - 1  # input ids, labels: the tokens less the last, the first
            input_ids = np.full(msl, ids["pad"], np.int32)
            labels = np.full(msl, ids["pad"], np.int32)
            input_ids[:length], labels[:length] = tokens[:-1], tokens[1:]
            loss_mask = np.zeros(msl, np.int32)
            loss_mask[num_patches:length] = 1
            key_padding = np.ones(msl, np.int32)
            key_padding[:length] = 0
            features = [input_ids, loss_mask, labels]
            if vsl_features:
                span = np.zeros(msl, np.int32)
                span[:length] = np.arange(length - 1, -1, -1)
                positions = np.zeros(msl, np.int32)
                positions[:length] = np.arange(length)
                features += [span, positions]
            rows.append(np.stack([*features, key_padding]))
            paths.append([path.encode("utf-8")])
        with h5py.File(folder / f"data-{i}.h5", "w") as f:
            f.attrs["n_examples"] = per_file
            f.create_dataset("data", data=np.stack(rows), dtype="i4", compression="gzip")
            f.create_dataset("img_path", data=np.array(paths, dtype="S"), compression="gzip")


def write_multimodal_simple_hdf5(folder: Path, num_patches: int, files: int = 2,
                                 per_file: int = 64, msl: int = MULTIMODAL_MSL,
                                 vocab: int = 512, max_num_img: int = 1,
                                 text_only_every: int = 8) -> None:
    """Samples of images within text as MultimodalSimpleHDF5MapDataProcessor reads them, in
    the layout the Model Zoo's multimodal fine-tuning token generator writes: ``files``
    "sample" files ``data-*.h5`` of ``per_file`` samples, each with ``data`` [n, 5, msl] int32
    (input ids, loss mask, labels, key padding mask, token modality: 1 on image tokens),
    ``img_path`` [n, max_num_img] (UTF-8 strings relative to ``images/``, ``"None"`` where a
    sample has fewer images), ``img_data_loc`` [n, max_num_img, num_patches] int32 (the
    positions of each image's patch tokens, ``msl`` for an image that is not there: the
    model's placeholder column past the sequence), ``has_img`` [n, 1] bool and the
    ``n_examples`` attribute; the images in ``folder / "images"``.

    A sample with an image is ``[bos] + [image] * num_patches + caption + [eos]`` (the image
    token the last id of the vocabulary, as the tokenizer appends it); every
    ``text_only_every``-th is ``[bos] + caption + [eos]`` without one. Its input ids are all
    the tokens but the last, its labels all but the first, the loss counts the caption's
    labels and its end, the key padding mask is 1 on the padding."""
    import h5py

    _check_fits(num_patches, msl)
    if max_num_img < 1:
        raise ValueError(f"max_num_img must be at least 1, got {max_num_img}")
    folder.mkdir(parents=True, exist_ok=True)
    images = write_caption_images(folder / "images", files * per_file)
    rng = np.random.default_rng(0)
    ids, image_token = MULTIMODAL_IDS, vocab - 1
    for i in range(files):
        rows, paths, locations, has_image = [], [], [], []
        for k, (path, label) in enumerate(images[i * per_file:(i + 1) * per_file]):
            with_image = (i * per_file + k) % text_only_every != text_only_every - 1
            patches = num_patches if with_image else 0
            text = caption(rng, label, int(rng.integers(4, msl - num_patches - 1)), vocab)
            tokens = [ids["bos"], *[image_token] * patches, *text, ids["eos"]]
            length = len(tokens) - 1
            input_ids = np.full(msl, ids["pad"], np.int32)
            labels = np.full(msl, ids["pad"], np.int32)
            input_ids[:length], labels[:length] = tokens[:-1], tokens[1:]
            loss_mask = np.zeros(msl, np.int32)
            loss_mask[patches:length] = 1  # the labels from the caption's first token on
            key_padding = np.ones(msl, np.int32)
            key_padding[:length] = 0
            modality = np.zeros(msl, np.int32)
            modality[1:1 + patches] = 1
            location = np.full((max_num_img, num_patches), msl, np.int32)
            if with_image:
                location[0] = np.arange(1, 1 + num_patches)
            rows.append(np.stack([input_ids, loss_mask, labels, key_padding, modality]))
            paths.append([path if with_image else "None"] + ["None"] * (max_num_img - 1))
            locations.append(location)
            has_image.append([with_image])
        with h5py.File(folder / f"data-{i}.h5", "w") as f:
            f.attrs["n_examples"] = per_file
            f.create_dataset("data", data=np.stack(rows), dtype="i4", compression="gzip")
            f.create_dataset("img_path", data=np.array(paths, dtype=object),
                             dtype=h5py.string_dtype(encoding="utf-8"), compression="gzip")
            f.create_dataset("img_data_loc", data=np.stack(locations), dtype="i4",
                             compression="gzip")
            f.create_dataset("has_img", data=np.array(has_image, np.bool_), compression="gzip")
