"""tessera.CriteoSynth and tessera.auc: the synthetic recommender data the
examples train on, seen from Python (no cluster needed)."""
import numpy as np
import pytest

import tessera


def test_batches_are_typed_arrays_of_the_documented_shapes():
    gen = tessera.CriteoSynth(seed=3)
    b = gen.train_range(100, 164)
    assert b["dense"].shape == (64, 13) and b["dense"].dtype == np.float32
    assert b["keys"].shape == (64, 26) and b["keys"].dtype == np.uint64
    assert b["labels"].shape == (64,) and set(np.unique(b["labels"])) <= {0.0, 1.0}
    assert b["truth_logits"].shape == (64,)
    assert (b["dense"] >= 0).all()
    # Zero-copy: the arrays are views of the generator's buffer, kept alive by it.
    assert not b["keys"].flags.owndata and b["keys"].base is not None


def test_examples_depend_only_on_their_index_and_partitions_tile_the_set():
    gen = tessera.CriteoSynth(seed=3)
    whole = gen.train_range(0, 90)
    parts = [gen.train_partition(p, 3, 90) for p in range(3)]
    np.testing.assert_array_equal(np.concatenate([p["keys"] for p in parts]), whole["keys"])
    np.testing.assert_array_equal(gen.train_range(30, 60)["dense"], whole["dense"][30:60])
    other = tessera.CriteoSynth(seed=4).train_range(0, 90)
    assert not np.array_equal(other["keys"], whole["keys"])


def test_fields_have_disjoint_keys_and_the_truth_auc_is_high():
    gen = tessera.CriteoSynth(seed=7)
    test = gen.test_set(20000)
    keys = test["keys"]
    for f in range(1, 26):
        assert not np.intersect1d(keys[:, 0], keys[:, f]).size
    truth = tessera.auc(test["truth_logits"], test["labels"])
    assert 0.7 < truth < 0.9
    assert tessera.auc(np.zeros(20000, np.float32), test["labels"]) == pytest.approx(0.5)


def test_bad_options_and_inputs_are_value_errors():
    with pytest.raises(ValueError, match="zipf"):
        tessera.CriteoSynth(zipf=-1.0)
    with pytest.raises(ValueError, match="cardinalit"):
        tessera.CriteoSynth(cardinalities=[10, 20])
    with pytest.raises(ValueError):
        tessera.auc(np.zeros(3, np.float32), np.zeros(4, np.float32))
    with pytest.raises(ValueError):
        tessera.CriteoSynth().train_partition(3, 3, 100)
