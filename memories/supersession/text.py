"""What a short fact says, read with simple rules: its words, its values, its signals.

No model and no parser: a fact such as "Staging Postgres was migrated to
pg-staging-7 last week" is read as content words (lower-cased, crudely
stemmed), typed values (hosts, emails, phone numbers, money, versions,
dates, times, counts, names), and the signals a change or an addition
leaves in wording ("now", "moved", "no longer", "actually"; "also",
"another"). ``memories.supersession.decide`` compares two readings.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from functools import lru_cache

QUOTE = "\u2019"  # the typographic apostrophe, as in "Priya\u2019s"


def word_set(words: str) -> frozenset[str]:
    return frozenset(words.split())


# Words that carry no subject: articles, pronouns, auxiliaries, prepositions.
STOP = word_set(
    """
    a an the this that these those it its it's is are was were be been being am has have had
    having do does did doing done of in on at to for from by with about as into onto over under
    than then there here and or but if so because while until after before during per via up
    down out off i me my mine we us our ours you your yours he him his she her hers they them
    their theirs who whom whose which what when where why how all any some each every both few
    more most other such only own same too very can could will would shall should may might
    must just also still yet again ever even not no nor s t d ll re ve m o y let lets get gets
    got getting go goes going went gone make makes made one ones thing things way week weeks day
    days month months year years time times last next ago lot bit
    mr mrs ms mx dr prof
    """
)

# Change words: the new memory says it replaces something.
CHANGE = word_set(
    """
    now new newly moved move moving switched switch switching changed change changing
    instead anymore updated update migrated migrate replaced replace replacing renamed
    rename upgraded upgrade downgraded bumped raised lowered reduced cut increased dropped
    rescheduled postponed delayed slipped pushed promoted relocated transferred
    became become left quit stopped stop ended renewed extended shortened tightened
    actually correction corrected wrong mistake typo rather latest current currently
    nowadays again scaled reinstalled retired rotated hired appointed started joined sold
    bought adopted gone rolled old former previous previously
    swapped swap swapping traded ditched abandoned cancelled canceled dumped
    """
)
CHANGE_PHRASES = (
    ("no", "longer"),
    ("not", "any", "more"),
    ("any", "more"),
    ("these", "days"),
    ("from", "now", "on"),
    ("going", "forward"),
    ("as", "of"),
    ("after", "all"),
    # A hand-over or an abandonment: "gave up judo", "Ana took over the team".
    ("gave", "up"),
    ("given", "up"),
    ("took", "over"),
    ("taken", "over"),
    ("handed", "over"),
    ("passed", "to"),
)
# Negations: the new memory may reverse the old one ("quit", "no longer").
NEGATION = word_set(
    "not no never none nobody don't doesn't didn't isn't aren't wasn't weren't won't can't "
    "cannot quit stopped without"
)
# An addition, not a replacement: "Ollie also enjoys hip hop".
ADDITIVE = word_set("also too another additionally besides")
ADDITIVE_PHRASES = (("as", "well"), ("in", "addition"), ("as", "well", "as"))

# Words of one set that tell two subjects apart ("the staging host" is not
# "the production host"); a word from one set in each memory, and neither
# memory holding the other's, means two subjects, whatever else they share.
# Words joined by "/" are one word ("prod" is "production").
CONTRASTS: tuple[frozenset[str], ...] = (
    word_set(
        "staging/stage/stg production/prod/prd development/dev test/testing qa sandbox "
        "preview replica reporting primary secondary canary local demo"
    ),
    word_set(
        "mother/mum/mom/mummy father/dad/daddy sister brother son daughter aunt uncle cousin "
        "niece nephew grandmother/grandma/gran/granny/nan grandfather/grandpa/grandad/granddad "
        "wife husband partner boyfriend girlfriend fiance/fiancee"
    ),
    word_set("morning afternoon evening night breakfast lunch dinner/supper bed/bedtime"),
    # A habit of weekdays, of weekends or of one day each week ("on Saturdays").
    word_set(
        "weekday/weekdays/weeknight/weeknights weekend/weekends mondays tuesdays wednesdays "
        "thursdays fridays saturdays sundays"
    ),
    word_set("mobile web ios android desktop backend frontend admin public internal private"),
    word_set("work personal home"),
    word_set("starter basic pro team enterprise business free premium"),
    word_set("london york paris berlin tokyo uk us eu"),
    word_set("dog cat rabbit hamster horse fish bird"),
    word_set("water electricity gas phone internet council"),
    word_set("warehouse registered"),
)
# Each word's set, and the word it stands for.
_CONTRAST_CLASS = {
    form: n for n, words in enumerate(CONTRASTS) for word in words for form in word.split("/")
}
_CANONICAL = {
    form: word.split("/")[0] for words in CONTRASTS for word in words for form in word.split("/")
}
assert len(_CONTRAST_CLASS) == sum(len(word.split("/")) for words in CONTRASTS for word in words), (
    "a word in two sets"
)
_KIN = _CONTRAST_CLASS["sister"]
# Times of day and days of the week: a subject's qualifier ("tea in the
# morning"), or, said straight after "is" in a sentence that states no clock
# time, the value ("Swimming lessons are on Saturday mornings"). Not the
# halves of a week ("Lunch is weekdays at 12:30" / "weekends at 1pm"), and
# not with a clock time, which is then the value the day qualifies ("Office
# hours are Tuesdays 2-4pm" / "Thursdays 10-12").
_WHEN = frozenset(
    word_set("morning afternoon evening night mondays tuesdays wednesdays thursdays fridays")
    | word_set("saturdays sundays")
)
# Capitalised by nature: a capital letter inside a sentence is no name's part.
_CAPITALISED = (_CONTRAST_CLASS["london"], _CONTRAST_CLASS["saturdays"])


def contrast_word(lower: str) -> str | None:
    """Return the CONTRASTS word ``lower`` stands for (plural or not), else None."""
    singular = lower[:-1] if lower.endswith("s") and lower[:-1] not in WEEKDAYS else lower
    for form in (lower, singular):
        if form in _CANONICAL:
            return _CANONICAL[form]
    return None


# The verb that states a subject's value ("X is Y").
COPULA = word_set("is are was were am")
# Words of what is to come: a date beside them is no date of a change made.
PLANNED = word_set(
    "will planned plan plans planning scheduled upcoming next soon beta tomorrow going due"
)
# Kin terms that are used as names, capitalised anywhere: "I called Mum".
KIN_NAMES = word_set("mother father grandmother grandfather")  # as contrast_word gives them
# States a subject is in, one at a time: a new one replaces the old.
STATES: dict[str, str] = {
    **dict.fromkeys(
        word_set("single dating engaged married divorced separated widowed seeing"), "relationship"
    ),
    **dict.fromkeys(word_set("vegetarian vegan pescatarian carnivore"), "diet"),
    **dict.fromkeys(
        word_set(
            "cycle cycles cycling bike bikes drive drives driving bus train tube walk walks "
            "walking carpool"
        ),
        "transport",
    ),
}
STATE_PHRASES = (("broke", "up"), ("split", "up"), ("got", "married"), ("got", "divorced"))

MONTHS = word_set(
    "january february march april may june july august september october november december "
    "jan feb mar apr jun jul aug sep sept oct nov dec"
)
WEEKDAYS = word_set(
    "monday tuesday wednesday thursday friday saturday sunday mondays tuesdays wednesdays "
    "thursdays fridays saturdays sundays"
)
# What may stand between "is" and the time it states: "is on Saturday mornings".
_BEFORE_WHEN = word_set("on every at in the early late") | WEEKDAYS
NUMBER_WORDS = word_set(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
    "fifteen sixteen seventeen eighteen nineteen twenty thirty forty fifty sixty seventy "
    "eighty ninety hundred thousand million billion half twice single double triple first "
    "third fourth fifth sixth seventh eighth ninth tenth dozen"
)
# Capitalised words that are not names.
NOT_NAMES = word_set(
    """
    i the a an my our your his her their its this that these those we you he she they it
    there here what when where who how why which mr mrs ms dr st i'm i've i'd i'll
    """
)

_TOKEN = re.compile(
    r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+"  # e-mail
    r"|[£$€]\s?\d[\d,]*(?:\.\d+)?k?"  # money
    r"|\d[\d,]*(?:\.\d+)*%?(?::\d+)?(?:am|pm|k|st|nd|rd|th|s)?"  # numbers, times, versions
    r"|[A-Za-z][\w']*(?:(?:://|[.\-/:=])[\w']+)*"  # words, hosts, URLs, identifiers
)
_PHONE = re.compile(r"(?<![\w.])(?:\+?\d[\d ()-]{5,}\d)(?!\w|\.\d)")
# A date written year first, "2026-03-01": no phone number, whatever its digits.
_ISO_DATE = re.compile(r"(?<![\w.-])(?:19|20)\d\d-\d\d?-\d\d?(?![\w-])")
_MONTH = (
    r"(jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|june?|july?|aug(?:ust)?"
    r"|sep(?:t(?:ember)?)?|oct(?:ober)?|nov(?:ember)?|dec(?:ember)?)"
)
# A day of a month is one date: "2 March", "the 14th of May", "March 2nd".
_DAY_MONTH = re.compile(
    rf"\b(\d{{1,2}})(?:st|nd|rd|th)?(?:\s+of)?\s+{_MONTH}\b\.?"
    rf"|\b{_MONTH}\s+(\d{{1,2}})(?:st|nd|rd|th)?\b(?!:|\.\d|,\d)",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class Value:
    kind: str  # email, host, phone, money, version, date, time, number, name, ...
    text: str  # normalised


@dataclass(frozen=True)
class Reading:
    """One memory's text, read for comparison."""

    words: frozenset[str]  # content words, stemmed, no stop, change or value words
    values: frozenset[Value]
    names_up_front: frozenset[str]  # names among the first words: the likely subject
    contrasts: frozenset[str]  # words of the CONTRASTS sets it holds
    # Those of them that are the time it states ("is on Saturday mornings").
    stated_when: frozenset[str]
    planned: bool  # speaks of what is to come ("v4 is planned for Tuesday")
    change: tuple[str, ...]  # change words and phrases it holds
    negated: bool
    additive: bool
    length: int  # words
    sentences: int
    question: bool  # asks rather than states
    exclaims: bool  # chatter ("Wow, great news!") rather than a record
    label: str  # a leading "Name:" label (a speaker), lower-cased, else ""


def stem(word: str) -> str:
    """Return a crude stem: enough to match "seats" with "seat", "parking" with "park"."""
    word = word.lower().replace(QUOTE, "'").strip("'")
    if word.endswith("'s"):
        word = word[:-2]
    if "'" in word:
        return word
    if len(word) > 4 and word.endswith("ies"):
        word = word[:-3] + "y"
    elif len(word) > 4 and word.endswith(("ches", "shes", "sses", "xes")):
        word = word[:-2]
    elif len(word) > 3 and word.endswith("s") and not word.endswith(("ss", "us", "is")):
        word = word[:-1]
    for suffix in ("ing", "ion", "ed"):
        if len(word) - len(suffix) >= 3 and word.endswith(suffix):
            word = word[: -len(suffix)]
            if len(word) > 3 and word[-1] == word[-2] and word[-1] not in "aeiouls":
                word = word[:-1]  # running -> run, planned -> plan
            break
    if len(word) > 3 and word.endswith("e"):
        word = word[:-1]
    return word


_TIME = re.compile(r"\d{1,2}(:\d\d)?(am|pm)|\d{1,2}:\d\d")
_YEAR = re.compile(r"(19|20)\d\d")
_DOTTED = re.compile(r"\d+(\.\d+){1,3}")
_HOST = re.compile(r"[a-z][.\-_/:=][a-z0-9]")
_DIGIT_OR_DOT = re.compile(r"[\d.]")
_DIGIT = re.compile(r"\d")
_VERSION = re.compile(r"v\d+(\.\d+)*")


def _number(lower: str) -> Value:
    if _TIME.fullmatch(lower):
        return Value("time", lower)
    if _YEAR.fullmatch(lower):
        return Value("date", lower)
    if _DOTTED.fullmatch(lower):
        return Value("version", lower)
    if lower.endswith("%"):
        return Value("share", lower)
    return Value("number", lower.replace(",", ""))


def _value(token: str, *, capitalised_name: bool) -> Value | None:
    # "shop.example.net's cert" holds shop.example.net (a name is stemmed anyway).
    lower = token.lower().rstrip(".,;:").removesuffix("'s")
    if "@" in lower:
        return Value("email", lower)
    if lower[:1] in "£$€":
        return Value("money", lower.replace(" ", "").replace(",", ""))
    if lower[:1].isdigit():
        return _number(lower)
    if _HOST.search(lower) and _DIGIT_OR_DOT.search(lower):
        # pg-staging-7, api.orchard.app, checkout_v2, django==5.1
        return Value("host", lower)
    if _VERSION.fullmatch(lower):
        return Value("version", lower)
    if _DIGIT.search(lower):
        return Value("identifier", lower)
    if lower in MONTHS and (lower != "may" or token[:1] == "M"):  # "may" is mostly a verb
        return Value("date", lower)
    if lower in WEEKDAYS:
        return Value("weekday", stem(lower))
    if lower in STATES:
        return Value(STATES[lower], stem(lower))
    parts = lower.split("-")
    if parts[0] in NUMBER_WORDS and not (len(parts) == 3 and parts[0] == stem(parts[2])):
        # "five", "twenty-two", "three-week"; not "one-on-one", a meeting. The
        # number is every number word up front: "twenty-two" is not "twenty-five".
        spoken = list(itertools.takewhile(NUMBER_WORDS.__contains__, parts))
        return Value("number", "-".join(spoken))
    if capitalised_name:
        return Value("name", stem(lower))
    return None


# A "?" or "!" that ends a sentence, not one inside a password or a URL's query
# ("Tr4ck!ng-99", "https://x.example/?page=2").
_ENDS_WITH = re.compile(r"""(?<![?!])[?!]+(?=[\s"')\]]|$)""")


# "twenty two" is "twenty-two": one number, however it is written.
# Not inside a host, an e-mail or a compound ("sixty one@example.org",
# "forty two-hour sessions").
_TENS_AND_UNITS = re.compile(
    r"(?<![\w.@/:-])(twenty|thirty|forty|fifty|sixty|seventy|eighty|ninety)[ \t]+"
    r"(one|two|three|four|five|six|seven|eight|nine)(?![\w@/:-]|\.\w)",
    re.IGNORECASE,
)
# Words after which "left" is a side ("the left monitor", "my left knee"), not
# a departure. Not those that are also pronouns: "the engineer that left",
# "this left Ben leading the team", "Sam, who hired her, left".
_SIDE_AFTER = word_set("the a an my our your their its")


def _a_side(lowered: list[str], at: int) -> bool:
    """Whether ``lowered[at]`` is "left" naming a side: "The left monitor", "my left knee"."""
    return lowered[at] == "left" and at > 0 and lowered[at - 1] in _SIDE_AFTER


def _at_hour(value: Value | None, before: list[str]) -> Value | None:
    """Read a small number after "at" as a time of day: "at 5"."""
    if (
        value is not None
        and value.kind == "number"
        and before == ["at"]
        and value.text.isdigit()
        and int(value.text) <= 24
    ):
        return Value("time", value.text)
    return value


def _settle_when(when: list[str], values: set[Value]) -> frozenset[str]:
    """Return the times said straight after "is" that are the sentence's value.

    None when it has a clock time: "is Wednesdays at 2pm" is 2pm, on a day.
    Each stays a contrast too; ``decide`` lets two such values differ only
    when nothing else does.
    """
    if any(v.kind == "time" for v in values):
        return frozenset()
    # A weekday is a value already; a time of day becomes one.
    values.update(Value("time", word) for word in when if word not in WEEKDAYS)
    return frozenset(when)


def _states_when(contrast: str, between: list[str], stated: bool) -> bool:
    """Whether a time of day or of the week is what "is" states: "is on Saturday mornings"."""
    return stated and contrast in _WHEN and all(w in _BEFORE_WHEN for w in between)


def _phrases(tokens: list[str], phrases: tuple[tuple[str, ...], ...]) -> list[str]:
    joined = f" {' '.join(tokens)} "
    return [" ".join(p) for p in phrases if f" {' '.join(p)} " in joined]


def _contrast(token: str, lower: str, *, inside: bool) -> str | None:
    """Return the CONTRASTS word a token stands for; ``inside``: capitalised mid-sentence."""
    word = contrast_word(lower.removesuffix("'s"))
    if word == "us" and not token.startswith("US"):
        return None  # the pronoun, not the country
    if word and inside and token.removesuffix("'s").isupper():
        return word  # an abbreviation, not a name's part: "the QA cluster"
    if word and inside and word not in KIN_NAMES and _CONTRAST_CLASS[word] not in _CAPITALISED:
        return None  # part of a name: "Lind & Partners", "Team Falcon"
    return word


# Abbreviations whose full stop ends no sentence: "Dr. Osei", "Mr. Patel".
_TITLE = re.compile(
    r"(?:^|[^\w.])(?:mr|mrs|ms|mx|dr|prof|st|fr|rev|sr|jr|e\.g|i\.e|vs|approx)\.$", re.IGNORECASE
)


def _starts_sentence(body: str, start: int) -> bool:
    before = body[max(0, start - 8) : start].rstrip(" \t\n\"'([")
    if before.endswith(".") and _TITLE.search(before):
        return False
    return start == 0 or (not before.strip() and start < 8) or before[-1:] in ".!?\n"


def _days(body: str) -> tuple[str, set[str]]:
    """Return ``body`` without its days of a month, and those days ("2 mar")."""
    days: set[str] = set()

    def day(found: re.Match[str]) -> str:
        number, month, month_first, number_after = found.groups()
        if (month or month_first) == "may":
            return found.group(0)  # the verb: "I may 3 times"
        days.add(f"{int(number or number_after)} {(month or month_first)[:3].lower()}")
        return " "

    return _DAY_MONTH.sub(day, body), days


def _parts(lower: str) -> set[str]:
    """Return the content words inside a hyphenated word, stemmed ("out-of-hours": hour)."""
    pieces = (stem(piece) for piece in lower.split("-")) if "-" in lower else ()
    return {p for p in pieces if len(p) >= 2 and p not in STOP and p not in CHANGE}


# Readings are cached for texts up to this length: a fact is a sentence or
# two (the rules compare at most 45 words), while a note may hold 50,000
# characters, and 4,096 of those would keep hundreds of megabytes of memory
# content in every process. A longer text is read each time it is compared.
CACHED_CHARS = 2_000


def read(text: str) -> Reading:
    """Return what ``text`` says, for comparing it with another memory."""
    return _read_cached(text) if len(text) <= CACHED_CHARS else _read(text)


@lru_cache(maxsize=4096)
def _read_cached(text: str) -> Reading:
    return _read(text)


def cached_readings() -> int:
    """How many readings the cache holds."""
    return _read_cached.cache_info().currsize


def clear_readings() -> None:
    """Empty the cache of readings."""
    _read_cached.cache_clear()


_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


def _in_words(found: re.Match[str]) -> str:
    """A date written year first, said in words ("1 Mar 2026,"): read as a day of a
    month and a year, never as a phone number with the time after it."""
    year, month, day = (int(part) for part in found.group(0).split("-"))
    if not (1 <= month <= 12 and 1 <= day <= 31):
        return found.group(0)
    return f"{day} {_MONTHS[month - 1]} {year},"


def _read(text: str) -> Reading:
    label = ""
    text = text.replace(QUOTE, "'")
    found = re.match(r"\s*([A-Z][\w']{0,30}):\s+(?=\S)", text)
    if found and found.group(1).lower() not in CHANGE:
        # "Caroline: I went ..." is a turn of a conversation: the speaker is
        # no subject the two memories share.
        label = found.group(1).lower()
        text = text[found.end() :]
    text = _ISO_DATE.sub(_in_words, text)
    phones = {re.sub(r"\D", "", m.group(0)) for m in _PHONE.finditer(text)}
    phones = {p for p in phones if len(p) >= 7}
    body = _TENS_AND_UNITS.sub(r"\1-\2", _PHONE.sub(" ", text))
    body, days = _days(body)
    matches = list(_TOKEN.finditer(body))
    raw = [m.group(0) for m in matches]
    # A token starts a sentence when only spaces, quotes or brackets stand
    # between it and the text's start or a full stop, "!" or "?".
    starts = [_starts_sentence(body, m.start()) for m in matches]
    lowered = [t.lower().rstrip(".,;:") for t in raw]
    values: set[Value] = {Value("phone", p) for p in phones}
    values |= {Value("day", d) for d in days}  # a day of a month, not a month or a year
    values |= {Value("relationship", p) for p in _phrases(lowered, STATE_PHRASES)}
    words: set[str] = set()
    up_front: set[str] = set()
    contrasts: set[str] = set()
    # Each token's: is it a change word ("left" as a side is not)?
    changing = [w in CHANGE and not _a_side(lowered, at) for at, w in enumerate(lowered)]
    change = [w for w, says in zip(lowered, changing, strict=True) if says]
    change += _phrases(lowered, CHANGE_PHRASES)
    negated = any(w in NEGATION or w.endswith("n't") for w in lowered)
    negated = negated or bool(_phrases(lowered, (("no", "longer"), ("any", "more"))))
    additive = any(w in ADDITIVE for w in lowered) or bool(_phrases(lowered, ADDITIVE_PHRASES))
    subject = True  # still among the first words, before the first plain content word
    stated = False  # past the sentence's first "is": what follows is its value
    copula = -1  # where that "is" stands
    when: list[str] = []  # times of day or week said straight after it
    for position, (token, lower) in enumerate(zip(raw, lowered, strict=True)):
        if lower in COPULA and not stated:
            stated, copula = True, position
        bare = stem(lower)
        capital = token[:1].isupper() and bare not in NOT_NAMES and lower not in CHANGE
        # A capitalised word inside a sentence is a name; so is a first word
        # in the possessive ("Priya's car"). Other first words may be plain
        # words ("Application logs ...") and are read as such.
        possessive = lower.endswith("'s")
        contrast = _contrast(token, lower, inside=capital and not starts[position])
        name = capital and (not starts[position] or possessive) and contrast is None
        value = _at_hour(_value(token, capitalised_name=name), lowered[position - 1 : position])
        if contrast is not None and _states_when(contrast, lowered[copula + 1 : position], stated):
            when.append(contrast)  # the time the sentence states, perhaps (_settle_when)
        if contrast is not None and not (stated and _CONTRAST_CLASS[contrast] == _KIN):
            # A relative after "is" is the value, not the subject: "My
            # emergency contact is my partner Sam" is about the contact.
            contrasts.add(contrast)
        if value is not None:
            values.add(value)
            if value.kind == "name":
                if subject and position < 3:
                    up_front.add(value.text)
                # A name is also a subject word ("Priya leads ...", "Priya's car").
                words.add(value.text)
            continue
        if bare in STOP or changing[position] or lower in NEGATION or lower in ADDITIVE:
            continue
        if len(bare) < 2:
            continue
        if position > 0:
            subject = False
        # One word however it is spelt: "prod" is "production", "Mum" "mother".
        words.add(stem(contrast) if contrast is not None else bare)
        # "out-of-hours" and "after-hours" share "hours"; "inventory-svc" is
        # the inventory service.
        words |= _parts(lower)
    stated_when = _settle_when(when, values)
    ends = "".join(_ENDS_WITH.findall(body))
    return Reading(
        words=frozenset(words),
        values=frozenset(values),
        names_up_front=frozenset(up_front),
        contrasts=frozenset(contrasts),
        stated_when=stated_when,
        planned=any(w in PLANNED for w in lowered),
        change=tuple(dict.fromkeys(change)),
        negated=negated,
        additive=additive,
        length=len(raw),
        sentences=max(1, sum(starts)),
        question="?" in ends,
        exclaims="!" in ends,
        label=label,
    )


def contrast_conflict(old: Reading, new: Reading) -> tuple[str, str] | None:
    """Return a pair of contrasting words, one held only by each memory, if any.

    "My sister lives in Porto" and "My brother lives in Ghent" hold sister
    and brother; "no longer wants morning meetings; afternoons only" holds
    morning too, so against "likes meetings in the morning" it is no conflict.
    """
    only_old = old.contrasts - new.contrasts
    only_new = new.contrasts - old.contrasts
    for a in sorted(only_old):
        for b in sorted(only_new):
            if _CONTRAST_CLASS[a] == _CONTRAST_CLASS[b]:
                return a, b
    # A relative shifts the subject on its own: "Maya's sister lives in
    # Leeds" is not about Maya.
    for word in sorted(only_old | only_new):
        if _CONTRAST_CLASS[word] == _KIN:
            return (word, "-") if word in only_old else ("-", word)
    return None


# Contrasts that say which of several a fact is about even when only one of two
# memories says it: "The staging database host" is not "The database host",
# "Breakfast on weekends" not "Breakfast". Not "work" (a verb as often: "Cormac
# works at ..."): "Mia's work phone" is a word added before the noun
# (``subjects._narrowed``). Not a platform: "mobile" is as often the value
# ("Dad only uses his mobile" after "Dad's landline is ...").
_QUALIFIERS = frozenset(_CONTRAST_CLASS[w] for w in ("staging", "morning", "saturdays"))
_TIMES_OF_DAY = word_set("morning afternoon evening night")


def qualifier_on_one_side(
    old: Reading, new: Reading, old_says: frozenset[str], new_says: frozenset[str]
) -> str | None:
    """Return a contrast word that one memory qualifies its subject with and the other
    lacks, if any; the caller keeps the two apart unless the newer says it changes
    something ("The production API key now rotates every 30 days"). ``old_says`` and
    ``new_says`` are the contrast words each says where they qualify
    (``subjects.qualifiers``): not in an aside ("..., she told me at lunch").

    Not the time a sentence states ("is on Saturday mornings"); not a day of the
    week when the other memory names a day ("Ada's piano lesson is Monday at 5" /
    "... on Thursdays at 4:30": the day is the value); not a time of day when both
    give a clock time ("the daily briefing at 7am" / "the morning briefing at 6:15").
    """
    for own, other, says in ((old, new, old_says), (new, old, new_says)):
        for word in sorted(own.contrasts - other.contrasts - own.stated_when):
            if _CONTRAST_CLASS[word] not in _QUALIFIERS or word not in says:
                continue
            kinds = {value.kind for value in other.values}
            if word in WEEKDAYS and "weekday" in kinds:
                continue
            if word in _TIMES_OF_DAY and "time" in kinds & {v.kind for v in own.values}:
                continue
            return word
    return None
