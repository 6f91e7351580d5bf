"""Data layer: TFDS builders, SentencePiece tokenizers, batching by tokens with restorable iterators.

Imports numpy, tensorflow_datasets and sentencepiece only (never flax or training code); no
TensorFlow is needed: datasets are written as ``array_record`` and read with
``builder.as_data_source(split)``.

| module | holds |
| --- | --- |
| ``multi30k/``, ``iwslt15_en_vi/``, ``wmt14/`` | one TFDS builder per dataset (``Builder``), TFDS folder style; ``wmt14/`` is TFDS's ``wmt14_translate/de-en`` from local files |
| ``parallel_text`` | their shared base: raw-file lookup (``source_dir``, ``$TRANSFORMER_DATA_DIR``, download), ``MissingDataError`` |
| ``source_files`` | raw-file fingerprints (size, SHA-256) that prepared data records and is checked against; ``data_fingerprint`` |
| ``download`` | downloads from the official URLs for every builder: a quick reachability check, one-line ``MissingDataError`` offline |
| ``tokenizers`` | ``SentencePieceTokenizer`` (pad 0, bos 1, eos 2, unk 3), training and on-disk cache |
| ``batching`` | ``TokenizedExamples``, ``TokenBatcher`` (buckets, token budget; each epoch planned once, the next ahead on a thread), the resumable ``BatchIterator`` |
| ``prefetch`` | ``PrefetchIterator`` (the next batches built on a background thread, same resumable state), ``prefetch_to_device``, ``BatchGroups`` |
| ``monolingual`` | one language of a parallel dataset as language-model data; ``chunk_long_sequences`` |
| ``translation`` | ``load_translation_data(name, pair, ...)``: the above tied together for translation |
| ``classification`` | ``fixed_batches`` and the resumable ``ShuffledBatches`` of labelled token arrays |
| ``hosts`` | many processes: every one walks the same global plan and builds only its rows of each batch, or takes them (``HostShard``, ``BuildsHostRows``, ``host_rows``, ``pad_rows``) |
| ``synthetic`` | copy / reverse / sort sequences (``make_examples``) and the resumable ``SyntheticBatches`` |
| ``beijing_pm25/`` | TFDS builder of the hourly UCI rows, ``read_csv``; ``features``: ``prepare``/``load`` -> ``PM25Series`` |
| ``timeseries`` | ``WindowedSeries`` (windows sliced on the fly, resumable iterator, fixed-shape eval batches), persistence baselines |
| ``files`` | files written whole (``write_atomically``, ``replacing``), the one-line disk-full error |

Submodules are imported explicitly (``from transformer.data import batching``), so that using
the batching alone does not import TFDS.
"""
