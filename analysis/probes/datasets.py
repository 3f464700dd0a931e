"""Small labelled sets, generated from word lists, for probing a language model.

``noun_number()``: a sentence that ends in a noun, singular or plural, labelled by the noun's number and
typed by the noun's form (the control task's word type): every form occurs in several frames, so the
control task's labels recur between the train and the held-out examples, as Hewitt and Liang's do.
Here the label is a function of the word type, so the control task is as easy as the task for any probe
that tells the 80 forms apart.

``subject_number()``: a subject noun phrase, "The cats near the window", read at its last token (a word
both numbers share), labelled by the subject's number and typed by the subject's form: the control task asks
the probe to read the subject's identity at a later token, the task its number, which the model needs there
to agree the coming verb.

>>> records = noun_number()
>>> len(records), records[0]
(640, {'text': 'I looked at the cat', 'label': 'singular', 'type': 'cat'})
>>> sum(record["label"] == "plural" for record in records)
320
>>> subject_number()[1]
{'text': 'The cat near the windows', 'label': 'singular', 'type': 'cat'}
"""

import json
from pathlib import Path

# singular -> plural; a few irregular ones, so the plural is not only a final "s"
NOUNS = {
    "cat": "cats",
    "dog": "dogs",
    "house": "houses",
    "car": "cars",
    "tree": "trees",
    "book": "books",
    "bird": "birds",
    "chair": "chairs",
    "table": "tables",
    "river": "rivers",
    "city": "cities",
    "box": "boxes",
    "church": "churches",
    "baby": "babies",
    "knife": "knives",
    "leaf": "leaves",
    "man": "men",
    "woman": "women",
    "child": "children",
    "mouse": "mice",
    "foot": "feet",
    "tooth": "teeth",
    "goose": "geese",
    "person": "people",
    "horse": "horses",
    "apple": "apples",
    "window": "windows",
    "door": "doors",
    "flower": "flowers",
    "teacher": "teachers",
    "student": "students",
    "doctor": "doctors",
    "farmer": "farmers",
    "garden": "gardens",
    "road": "roads",
    "bridge": "bridges",
    "letter": "letters",
    "song": "songs",
    "story": "stories",
    "mountain": "mountains",
}
FRAMES = (
    "I looked at the {}",
    "She talked about the {}",
    "We walked past the {}",
    "They were thinking of the {}",
    "He pointed to the {}",
    "Nobody noticed the {}",
    "The picture showed the {}",
    "Everyone remembered the {}",
)
# what follows the subject: a prepositional phrase or a relative clause, no verb that shows number; some
# end in a noun of the other number (an attractor)
PHRASES = (
    "in the garden",
    "near the windows",
    "from the old farm",
    "on the other side of the roads",
    "that we saw yesterday",
    "behind the door",
    "with the red boxes",
    "at the end of the street",
)


def noun_number() -> list[dict]:
    """``{"text", "label", "type"}`` records: each noun of ``NOUNS``, singular and plural, in each of ``FRAMES``."""
    records = []
    for singular, plural in NOUNS.items():
        for label, noun in (("singular", singular), ("plural", plural)):
            records += [{"text": frame.format(noun), "label": label, "type": noun} for frame in FRAMES]
    return records


def subject_number() -> list[dict]:
    """``{"text", "label", "type"}`` records: "The <noun> <phrase>" for each noun of ``NOUNS``, singular and
    plural, and each of ``PHRASES``; the label is the subject's number, the type the subject's form."""
    records = []
    for singular, plural in NOUNS.items():
        for label, noun in (("singular", singular), ("plural", plural)):
            records += [{"text": f"The {noun} {phrase}", "label": label, "type": noun} for phrase in PHRASES]
    return records


def write_jsonl(records: list[dict], path: str | Path) -> Path:
    """Write records one JSON object per line (what ``interp-transformer probe --data`` reads)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(record) + "\n" for record in records), encoding="utf-8")
    return path
