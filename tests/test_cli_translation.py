"""The command line on the shipped translation model: its report, and retraining it into a directory of one's own."""

import json

from analysis.cli import EXIT_OK, EXIT_USAGE, main
from interp_transformer.pretrained import load_shipped


def test_report_on_translate_tiny(tmp_path, capsys):
    out = tmp_path / "translate.html"
    code = main(
        ["report", "--model", "translate-tiny", "--prompt", "twelve thousand three hundred five", "--out", str(out)]
    )
    printed = capsys.readouterr().out
    assert code == EXIT_OK and out.is_file()
    assert "predicts '1 2 3 0 5 </s>'" in printed
    assert "follows the known alignment" in printed
    assert 'id="alignment"' in out.read_text(encoding="utf-8")


def test_a_word_outside_the_vocabulary_is_a_usage_error(tmp_path, capsys):
    code = main(["report", "--model", "translate-tiny", "--prompt", "twelfth", "--out", str(tmp_path / "r.html")])
    assert code == EXIT_USAGE
    assert "unknown words ['twelfth']" in capsys.readouterr().err


def test_train_translation_saves_a_loadable_model_with_its_card(tmp_path, capsys):
    code = main(["train-translation", "--steps", "3", "--batch", "8", "--out-dir", str(tmp_path)])
    assert code == EXIT_OK, capsys.readouterr().err
    card = json.loads((tmp_path / "translate-tiny.json").read_text())
    assert card["command"] == "interp-transformer train-translation --steps 3 --batch 8 --lr 0.002 --seed 0"
    assert card["training"]["steps"] == 3 and len(card["curve"]["steps"]) == 2
    assert 0.0 <= card["held_out"]["exact_match"] < 0.5  # three steps teach it nothing
    model = load_shipped("translate-tiny", directory=tmp_path)
    assert model.cfg == load_shipped("translate-tiny").cfg and model.tokenizer is not None
