"""runjob-hf's inputs (prompts, texts to classify, words to tag) kept by a run as data: the
tokenizer's ``tokenizer.json`` and its special token ids, the length and the class names as JSON.
Rebuilt from them, they encode as the dataset's own did; data or a tokenizer file that is not what
they wrote is refused in one line naming what is wrong."""

import json

import pytest
from corpora import reviews
from runjob_hf.inputs import Prompts, Texts, Words
from runjob_hf.options import TrainTokenizer
from runjob_hf.tokenizing import train_tokenizer

from runjob.testing import round_trip_inputs

TEXTS = [row["text"] for row in reviews(60)]


@pytest.fixture(scope="module")
def vocabularies(tmp_path_factory):
    cache = tmp_path_factory.mktemp("tokenizers")
    settings = TrainTokenizer(kind="bpe", vocab_size=300, min_frequency=1)
    return {
        "lm": train_tokenizer(settings, TEXTS, "lm", cache, "reviews"),
        "encoder": train_tokenizer(settings, TEXTS, "encoder", cache, "reviews"),
    }


def _as_lists(encoded):
    if isinstance(encoded, dict):
        return {key: value.tolist() for key, value in encoded.items()}
    return encoded.tolist()


@pytest.mark.parametrize(
    ("cls", "purpose", "classes"),
    [(Prompts, "lm", None), (Texts, "encoder", ["neg", "pos"]), (Words, "encoder", ["LOC", "O", "PER"])],
)
def test_kept_as_a_tokenizer_file_and_json_they_encode_as_before(vocabularies, tmp_path, cls, purpose, classes):
    original = cls(vocabularies[purpose], 12, classes)
    rebuilt = round_trip_inputs(original, tmp_path / "kept")
    data = original.to_data(tmp_path / "again")
    json.dumps(data, allow_nan=False)  # plain JSON values
    assert data["tokenizer"] == "tokenizer.json"
    assert (tmp_path / "again" / "tokenizer.json").read_text(encoding="utf-8") == vocabularies[purpose].json
    assert rebuilt.vocabulary == original.vocabulary and rebuilt.vocabulary.special
    assert (rebuilt.max_length, rebuilt.classes) == (12, classes)
    record = {"text": "a really excellent film about oslo and alice, and birds that sing"}
    assert _as_lists(rebuilt.encode(record)) == _as_lists(original.encode(record))
    if cls is Prompts:
        ids = original.encode(record).tolist()
        assert rebuilt.decode(ids) == original.decode(ids) and "excellent film" in rebuilt.decode(ids)
    else:
        assert len(rebuilt.encode(record)["input_ids"]) == 12, "cut at max_length as the dataset's rows are"


@pytest.fixture
def kept(vocabularies, tmp_path):
    folder = tmp_path / "inputs"
    return Texts(vocabularies["encoder"], 16, ["neg", "pos"]).to_data(folder), folder


MISSING = object()


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ({"max_length": MISSING}, "max_length: Field required"),
        ({"max_length": "16"}, 'max_length = "16"'),
        ({"pad_id": 1.5}, "pad_id = 1.5"),
        ({"classes": "neg"}, "classes"),
        ({"special": {"pad_token": 0}}, "special.pad_token"),
        ({"pad_id": 99_999}, "pad_id = 99999: not a token id"),
        ({"tokenizer": "../../tokenizer.json"}, "must name a file in"),
        ({"tokenizer": "gone.json"}, "tokenizer: cannot read"),
        ({"extra": 1}, "extra"),
    ],
)
def test_data_not_as_written_is_refused_naming_the_key(kept, change, said):
    data, folder = kept
    data = {key: value for key, value in {**data, **change}.items() if value is not MISSING}
    with pytest.raises(ValueError) as raised:
        Texts.from_data(data, folder)
    message = str(raised.value)
    assert said in message and "\n" not in message


@pytest.mark.parametrize("text", ["", "not json", '{"version": "1.0", "model": {"type": "Nonsense"}}'])
def test_a_tokenizer_file_tokenizers_refuses_is_a_value_error(kept, text):
    data, folder = kept
    (folder / "tokenizer.json").write_text(text, encoding="utf-8")
    with pytest.raises(ValueError, match=r"tokenizer: .*tokenizer\.json is not a tokenizers tokenizer\.json"):
        Texts.from_data(data, folder)
