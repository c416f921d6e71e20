"""Which thing a memory is about, read from its first words.

A short fact names its subject first: "Room 101 is on floor 1", "The orders
database is 420 GB", "Car insurance renews in March", "The k8s cluster in
eu-west-1 runs 12 nodes". Two memories that open alike but for the words
naming the thing are about two things, whatever else differs: a fleet's
hosts, a ledger's rows, a family's policies, one question asked of two
countries. Said one after the other, they share subject words and change a
value, which is what an update looks like to the scored rules; they were
linked as one slot's old and new value, and the first hidden.

``two_things(old, new)`` returns why two memories are about two things, or
None. The naming words must stand in the subject, before any verb or
copula: past it they are the slot's value ("The project uses Python 3.11"
then "Python 3.12", "Standup is in Room 4" then "Room 7"). The caller skips
it when the newer memory says it changes something ("Port 6432 is used by
staging now"). A version is no name ("Version 3 is deployed"): a deploy
moves it on.

It reads at most the first dozen words: a search's newer-first pairs run it
on every recall.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator

from memories.supersession.text import CHANGE, COPULA, STOP, contrast_word, stem, word_set

# A word, host, version or identifier ("Ana's", "web-1", "10.0.0.1"). It
# starts only where no such character stands before it, so a long run of
# them is scanned once, not once from each of its characters.
_TOKEN = re.compile(r"(?<![\w.\-/:#'\u2019()])[#\w][\w.\-/:#'\u2019()]*")
_TRAILING = re.compile(r"[^\w]+$")
_PUNCTUATION = re.compile(r"[\-()'\u2019.]")
# The most characters read: the opening's words lie well within them.
_SCANNED = 400
_HEAD = 6  # the shared opening looked at, in words
_SPAN = 2  # the most words on each side that name the thing
_NOT_LABELS = frozenset({"version", "v", "release", "build", "revision", "rev"})
_YEAR_OR_CODE = re.compile(r"(?:19|20)\d\d|[a-z]+\d+[a-z\d]*")
_NUMBER_NAME = re.compile(r"\d+[a-z]?")  # "737", "401k", "12b": not "9am", "24gb"
# Plurals without an s, and nouns of a group: a number before one counts.
_PLURALS = frozenset(
    [
        "people",
        "children",
        "men",
        "women",
        "staff",
        "folk",
        "personnel",
        "crew",
        "police",
        "cattle",
        "feet",
        "teeth",
        "mice",
        "geese",
        "sheep",
        "fish",
        "deer",
    ]
)
_OF = frozenset({"of", "for"})
# Prepositions that may qualify a subject ("the cluster in eu-west-1", "lunch
# with Ana"): two openings alike up to and through one still name one thing
# until they differ.
_JOINS = _OF | frozenset({"in", "at", "with", "on", "to", "from"})
_NAMING = re.compile(r"[\w\-]+")
_DETERMINERS = frozenset({"the", "a", "an", "our", "my", "your", "their", "his", "her", "its"})
# Words STOP holds that may name a thing in a subject: "Phase one", "the
# wake-up time", "next year's budget".
_NOUNY = word_set(
    "one ones time times day days week weeks month months year years thing things next last"
)
# Verbs common in short facts that STOP does not hold: past one, the subject has ended.
_VERBS = word_set(
    """
    use uses used run runs ran live lives lived work works worked prefer prefers preferred
    like likes liked cost costs take takes took need needs want wants own owns pay pays paid
    call calls called sit sits meet meets start starts end ends hold holds held serve serves
    served point points host hosts weigh weighs sleep sleeps play plays played renew renews
    renewed expire expires expired open opens opened close closes closed ship ships shipped
    lead leads eat eats drive drives speak speaks read reads include includes belong belongs
    stay stays manage manages handle handles send sends visit visits love loves enjoy enjoys
    hate hates measure measures charge charges earn earns deploy deploys last lasts cover
    covers reach reaches seat seats land lands listen listens leave leaves arrive arrives
    """
)


def two_things(old: str, new: str) -> str | None:
    """Return why ``old`` and ``new`` are about two things their openings name, or None."""
    a, b = _opening(old), _opening(new)
    return _labelled(a, b) or _named(a, b, old, new) or _narrowed(a, b, old, new)


def numbered_things(old: str, new: str) -> str | None:
    """Return why ``old`` and ``new`` name two things by a number, or None.

    A number between a determiner and the same noun names which one: "The 737 / 787
    fleet", "Our 401k / 529 provider", "The 12 / 12b bus", "The 7731 / 7732 build agent".
    A change word does not make them one ("Our 529 provider is now Vanguard" says what
    changed for the 529, not for the 401k). A count is not a name: it has no determiner
    ("12 / 15 people attend"), or a plural noun after it ("The 5 / 7 engineers"). A
    measure before a noun may be either ("The 30 / 15 minute standup", "The 100 / 200
    meter race"): kept apart, since a hidden true fact costs more than a missed update."""
    a, b = _opening(old), _opening(new)
    for k in range(min(_HEAD, len(a) - 1, len(b) - 1)):
        x, y = a[k].lower(), b[k].lower()
        if x == y:
            continue
        if k == 0 or a[k - 1].lower() not in _DETERMINERS or not _subject_so_far(a[:k]):
            return None
        if not (_NUMBER_NAME.fullmatch(x) and _NUMBER_NAME.fullmatch(y)):
            return None
        noun = a[k + 1].lower()
        if noun != b[k + 1].lower() or not noun.isalpha() or noun in STOP:
            return None
        if noun in _PLURALS or (noun.endswith("s") and not noun.endswith(("ss", "us", "is"))):
            return None  # plural: how many
        return f"about two things ({a[k]} / {b[k]})"
    return None


def words(text: str) -> Iterator[str]:
    """The words of a text's first ``_SCANNED`` characters, trailing punctuation off."""
    for found in _TOKEN.finditer(text[:_SCANNED]):
        word = _TRAILING.sub("", found.group())
        if word:
            yield word


def _opening(text: str) -> list[str]:
    # The first words only.
    return list(itertools.islice(words(text), _HEAD + _SPAN + 4))


def _verb(word: str, before: str | None) -> bool:
    """Whether ``word`` reads as a verb; an unknown lower-case word in -s after a noun does
    ("The user weighs 82 kg", "The printer jams")."""
    lower = word.lower()
    if lower in _VERBS or lower in COPULA:
        return True
    plural_like = lower.endswith("s") and not lower.endswith(("ss", "us", "is", "'s"))
    return (
        before is not None
        and word.isalpha()
        and word.islower()
        and len(word) > 3
        and plural_like
        and before.lower() not in _DETERMINERS
        and before.lower() not in STOP
    )


def _subject_so_far(words: list[str], joins: frozenset[str] = _OF) -> bool:
    """Whether ``words``, a memory's opening, can still be its subject: no verb yet, and
    no preposition but ``joins`` ("Standup is in Room 4" names the room as a value)."""
    for at, word in enumerate(words):
        lower = word.lower()
        stop = lower in STOP and lower not in joins and lower not in _DETERMINERS
        if (stop and lower not in _NOUNY) or _verb(word, words[at - 1] if at else None):
            return False
    return True


# -- a label: an identifier after the same noun, a code before it, a "<noun> of" question


def _noun(word: str) -> bool:
    word = word.lower()
    return word.isalpha() and len(word) > 1 and word not in STOP and word not in _NOT_LABELS


def _label(word: str) -> bool:
    """A token that names rather than says: with a digit, or one capital letter ("Item A")."""
    return any(c.isdigit() for c in word) or (len(word) == 1 and word.isupper())


def _qualified(words: list[str], k: int) -> bool:
    """Whether ``words[k]`` follows "<noun> of" or "<noun> for" (a "the" between allowed)."""
    at = k - 1
    if at >= 1 and words[at].lower() in _DETERMINERS:
        at -= 1
    return at >= 1 and words[at].lower() in _OF and _noun(words[at - 1])


def _labelled(a: list[str], b: list[str]) -> str | None:
    """Two things told apart by a label: "Room 101" / "Room 202", "Q3 revenue" / "Q4
    revenue", "the capital of France" / "of Spain"."""
    for k in range(min(_HEAD, len(a), len(b))):
        x, y = a[k], b[k]
        if x.lower() == y.lower():
            continue
        if not _subject_so_far(a[:k]):
            return None
        before_noun = k + 1 < min(len(a), len(b)) and a[k + 1].lower() == b[k + 1].lower()
        before_noun = before_noun and _noun(a[k + 1])
        labels = _label(x) and _label(y)
        named = labels and k > 0 and _noun(a[k - 1])
        coded = labels and before_noun and bool(_YEAR_OR_CODE.fullmatch(x.lower()))
        asked = _qualified(a, k) and all(
            _NAMING.fullmatch(w) and w.lower() not in STOP for w in (x, y)
        )
        return f"about two things ({x} / {y})" if named or coded or asked else None
    return None


# -- a name: a word or two in the subject, the rest of the opening the same


def _fold(word: str) -> str:
    """A word as compared: "Wi-Fi" is "wifi", "401(k)" is "401k", "prod" is "production"."""
    lower = _PUNCTUATION.sub("", word.lower())
    return contrast_word(lower) or lower


def _alike(a: str, b: str) -> bool:
    """One word spelt two ways or in two forms: "favorite" / "favourite", "dentist" / "dental"."""
    a, b = _fold(a), _fold(b)
    common = next(
        (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )
    return a == b or (common >= 4 and a[:common].isalpha())


def _naming_word(word: str) -> bool:
    lower = word.lower()
    if lower in CHANGE or lower in _NOT_LABELS or _verb(word, None):
        return False
    return lower not in STOP or lower in _NOUNY or (len(word) > 1 and word.isupper())  # "US"


def _rejoin(a: list[str], b: list[str], k: int) -> tuple[int, int] | None:
    """The shortest spans a[k:k+m], b[k:k+n] (1 to ``_SPAN`` words each) after which the
    two openings agree again: a word swapped for a word, not one added ("Ada's piano
    lesson" may be "Ada's piano")."""
    spans = itertools.product(range(1, _SPAN + 1), repeat=2)
    fits = [(m, n) for m, n in spans if k + m < len(a) and k + n < len(b) and a[k + m] == b[k + n]]
    return min(fits, key=sum) if fits else None


def _stems(text: str) -> set[str]:
    return {stem(word) for word in words(text)}


def _named(opening_old: list[str], opening_new: list[str], old: str, new: str) -> str | None:
    """Two things named in the subject by a word or two: "The orders / users database",
    "Car / Home insurance renews", "Phase one / two of the renovation", "The cluster in
    eu-west-1 / us-east-1". Each side's name is a word the other memory holds nowhere, so a
    subject said in other words is not two things ("Standup meeting" / "Daily standup")."""
    a = [w for w in opening_old if w.lower() not in _DETERMINERS]
    b = [w for w in opening_new if w.lower() not in _DETERMINERS]
    fa, fb = [_fold(w) for w in a], [_fold(w) for w in b]
    k = next((i for i, (x, y) in enumerate(zip(fa, fb, strict=False)) if x != y), None)
    if k is None or k >= _HEAD or not _subject_so_far(a[:k], _JOINS):
        return None
    found = _rejoin(fa, fb, k)
    if found is None or (k and a[k - 1].lower() in _NOT_LABELS):
        return None
    xs, ys = a[k : k + found[0]], b[k : k + found[1]]
    if not all(_naming_word(w) for w in xs + ys):
        return None
    if not any(c.isalpha() for c in "".join(xs)) or not any(c.isalpha() for c in "".join(ys)):
        return None  # "5 engineers" / "7 engineers": a count, the slot's value
    if any(_alike(x, y) for x in xs for y in ys):
        return None  # one subject, spelt or shortened two ways
    sx, sy = {stem(w) for w in xs}, {stem(w) for w in ys}
    if sx & sy or not sx - _stems(new) or not sy - _stems(old):
        return None
    return f"about two things ({' '.join(xs)} / {' '.join(ys)})"


# -- a word added: "The lease ends ..." / "The car lease ends ..."


def _narrowed(opening_old: list[str], opening_new: list[str], old: str, new: str) -> str | None:
    """A newer subject narrowed by a word before its noun: "The lease" / "The car lease",
    "Our Stripe account email" / "Our Stripe test account email". The narrower is another
    thing than the wider, which stays true of the others, as with a word swapped there
    (``_named``). Not the other way round: a restatement often says less ("The house
    alarm code is 2580" / "Alarm code is 7314 after the engineer's visit", "The data
    warehouse refresh" / "Warehouse refresh cron"). Not a word before the verb ("Ada's
    piano" / "Ada's piano lesson" may be one thing), not how often ("The nightly backup
    job"), and not a word the older memory holds anywhere."""
    a = [w for w in opening_old if w.lower() not in _DETERMINERS]
    b = [w for w in opening_new if w.lower() not in _DETERMINERS]
    return _one_word_more(a, b, old)


def _one_word_more(short: list[str], long: list[str], wide: str) -> str | None:
    """Why ``long`` names another thing than ``short``: its subject with one word more before
    a noun, a word ``wide`` (the shorter one's text) holds nowhere; else None."""
    fs, fl = [_fold(w) for w in short], [_fold(w) for w in long]
    k = next((i for i, (x, y) in enumerate(zip(fs, fl, strict=False)) if x != y), None)
    if k is None or k >= _HEAD or k + 1 >= len(long) or k >= len(short):
        return None
    if fl[k + 1] != fs[k] or not _subject_so_far(short[:k], _JOINS):
        return None
    noun, word = short[k], long[k]
    if not _noun(noun) or _verb(noun, short[k - 1] if k else None) or _past(noun):
        return None
    after = short[k + 1] if k + 1 < len(short) else None
    if after is not None and not (_verb(after, noun) or _noun(after) or after.lower() in _JOINS):
        return None  # "The server crashed 3 times": no noun ends a subject there
    if not (word.isalpha() and word.islower()) or not _modifier(word):
        return None
    if stem(word) not in _stems(wide):
        return f"about two things ({word} {noun} / {noun})"
    return None


def _past(word: str) -> bool:
    """A past tense read as a noun by the word lists ("arrived", "completed")."""
    return len(word) > 4 and word.lower().endswith("ed")


def _modifier(word: str) -> bool:
    """Whether ``word`` before a noun may say which thing: a verb's form may ("Mia's work
    phone"), an adverb ("finally"), how often ("nightly") or which version ("the
    correct date", "the final price") may not."""
    lower = word.lower()
    if lower in CHANGE or lower in _NOT_LABELS or lower in STOP:
        return False
    return not lower.endswith("ly") and lower not in _WHICH_VERSION


# Which version of one thing, not which thing: a correction's or an estimate's words.
_WHICH_VERSION = word_set(
    """
    correct corrected actual revised updated confirmed final official exact real true
    agreed total overall proper right usual normal regular standard main current latest
    present precise approximate estimated expected proposed previous former original
    """
)


def qualifiers(text: str) -> frozenset[str]:
    """The contrast words (``contrast_word``'s) that may say which thing ``text`` is about:
    those in its subject, before the first verb ("The staging database host is ..."),
    and a habit's days said anywhere ("The gym opens at 8am on Sundays"). Not a word of
    an aside after the verb ("..., she told me at lunch", "reset after the demo")."""
    found: set[str] = set()
    subject = True
    previous: str | None = None
    for word in words(text):
        lower = word.lower()
        if subject and (_verb(word, previous) or lower in COPULA):
            subject = False
        named = contrast_word(lower.removesuffix("'s"))
        if named is not None and (subject or lower in _HABITS):
            found.add(named)
        previous = word
    return frozenset(found)


# Days said in the plural are a habit's, which a fact may hold for only on them.
_HABITS = word_set(
    "mondays tuesdays wednesdays thursdays fridays saturdays sundays weekdays weekends weeknights"
)
