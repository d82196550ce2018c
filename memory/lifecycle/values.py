"""The values a fact states: what two facts that embed alike must share to be the same fact.

"主人周一健身" and "主人周三健身", "The owner runs 5 km" and "5 miles", "主人喜欢猫"
and "主人不喜欢猫" embed within 0.94-0.99 of each other (the default embedding
puts rewordings as low as 0.82), so the near-duplicate rule (`memory.lifecycle.duplicates`)
also asks them to state the same values (`values`): numbers (Arabic, Chinese,
English words, ordinals: "三", "3", "three", "第三", "3rd" are one value; "一只" /
"一个" is an article, no number), weekdays, months, days and periods named relative
to now, the units a number counts, the period a frequency is per, whether the fact
is negated, and the members of a few closed classes whose members exclude each
other (kin, colours, seasons, pets: "姐姐"/"妹妹" and "green"/"black" tea embed at
0.89-0.91). Measured on `tests/data/memory_duplicate_pairs.jsonl`
(`tests/test_memory_duplicates.py`).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

_CN_DIGITS = {"零": 0, "〇": 0, "一": 1, "二": 2, "两": 2, "三": 3, "四": 4, "五": 5, "六": 6,
              "七": 7, "八": 8, "九": 9}  # fmt: skip
_CN_UNITS = {"十": 10, "百": 100, "千": 1000, "万": 10_000, "亿": 100_000_000}
_EN_NUMBERS = {
    "zero": 0, "one": 1, "once": 1, "first": 1, "two": 2, "twice": 2, "second": 2,
    "three": 3, "third": 3, "four": 4, "fourth": 4, "five": 5, "fifth": 5, "six": 6,
    "sixth": 6, "seven": 7, "seventh": 7, "eight": 8, "eighth": 8, "nine": 9, "ninth": 9,
    "ten": 10, "tenth": 10, "eleven": 11, "twelve": 12, "twenty": 20, "thirty": 30,
    "hundred": 100, "thousand": 1000, "half": 0.5,
}  # fmt: skip
_WEEKDAYS = {
    "一": "mon", "二": "tue", "三": "wed", "四": "thu", "五": "fri", "六": "sat", "日": "sun",
    "天": "sun", "末": "weekend",
}  # fmt: skip
_EN_DAYS = {
    "monday": "mon", "tuesday": "tue", "wednesday": "wed", "thursday": "thu", "friday": "fri",
    "saturday": "sat", "sunday": "sun", "weekend": "weekend",
}  # fmt: skip
_EN_MONTHS = [
    "january",
    "february",
    "march",
    "april",
    "may",
    "june",
    "july",
    "august",
    "september",
    "october",
    "november",
    "december",
]
_RELATIVE = {
    "今天": "today", "明天": "tomorrow", "昨天": "yesterday", "后天": "day+2", "前天": "day-2",
    "今年": "this-year", "明年": "next-year", "去年": "last-year", "上周": "last-week",
    "下周": "next-week", "本周": "this-week", "这周": "this-week", "上个月": "last-month",
    "下个月": "next-month", "这个月": "this-month", "today": "today", "tomorrow": "tomorrow",
    "yesterday": "yesterday", "tonight": "today",
}  # fmt: skip
_PERIODS = {
    "天": "day", "日": "day", "晚": "night", "周": "week", "星期": "week", "礼拜": "week",
    "月": "month", "年": "year", "小时": "hour", "分钟": "minute", "秒": "second",
    "day": "day", "night": "night", "week": "week", "month": "month", "year": "year",
    "hour": "hour", "minute": "minute", "second": "second",
}  # fmt: skip
_UNITS = {
    "公里": "km", "千米": "km", "km": "km", "kilometre": "km", "kilometer": "km",
    "英里": "mile", "mile": "mile", "米": "m", "厘米": "cm", "cm": "cm", "毫米": "mm",
    "mm": "mm", "公斤": "kg", "千克": "kg", "kg": "kg", "斤": "jin", "磅": "lb", "lb": "lb",
    "pound": "lb", "元": "yuan", "块": "yuan", "美元": "usd", "dollar": "usd", "欧元": "eur",
    "euro": "eur", "楼": "floor", "层": "floor", "floor": "floor", "号": "number",
    "点": "o'clock", "pm": "pm", "am": "am", "岁": "age", "次": "times", "time": "times",
}  # fmt: skip
_CLASSES = {
    "kin": (
        "爸爸 妈妈 父亲 母亲 哥哥 姐姐 弟弟 妹妹 儿子 女儿 丈夫 妻子 老公 老婆 爷爷 奶奶 外公 外婆 "
        "father mother dad mum mom brother sister son daughter husband wife grandfather "
        "grandmother grandpa grandma uncle aunt cousin"
    ),
    "colour": (
        "红 绿 蓝 黄 黑 白 紫 橙 灰 粉 red green blue yellow black white purple orange grey gray pink"
    ),
    "season": "春 夏 秋 冬 spring summer autumn fall winter",
    "pet": "猫 狗 兔 鹦鹉 仓鼠 金鱼 cat dog rabbit parrot hamster goldfish",
}
_CLASS_OF = {word: name for name, words in _CLASSES.items() for word in words.split()}
_NEGATIONS_CN = ("从未", "从不", "没有", "不", "没", "未", "别", "无", "非")
_NEGATIONS_EN = frozenset({"not", "no", "never", "none", "without", "nobody", "nothing"})
_DIGITS = re.compile(r"\d+(?:\.\d+)?")
_NUMBER_TOKEN = re.compile(
    r"第?[零〇一二两三四五六七八九十百千万亿]+|第?\d+(?:\.\d+)?(?:st|nd|rd|th)?|[a-z]+|半"
)
_COUNTED = re.compile(
    r"(?:个|只|本|杯|次|岁|点|号|楼|层|年|月|日|天|周|小时|分钟|公里|千米|英里|米|厘米|毫米|"
    r"公斤|千克|斤|磅|元|块|美元|欧元|万|千|百|人|辆|套|间|份|遍|倍|%)"
)
_ARTICLE = re.compile(r"(?:个|只|本|杯|辆|套|间|份|位|条|件|家|张)")
_WORD = re.compile(r"[a-z]+(?:'[a-z]+)?|\d+(?:\.\d+)?(?:st|nd|rd|th)?")


def _chinese_number(text: str) -> float:
    """The value of a Chinese numeral ("十二" 12, "两万" 20000, "二零一九" read digit by digit)."""
    if all(ch in _CN_DIGITS for ch in text) and len(text) > 1:
        return float("".join(str(_CN_DIGITS[ch]) for ch in text))
    total, section, digit = 0.0, 0.0, 0.0
    for ch in text:
        if ch in _CN_DIGITS:
            digit = _CN_DIGITS[ch]
        elif ch in ("万", "亿"):
            total += (section + digit) * _CN_UNITS[ch]
            section, digit = 0.0, 0.0
        else:
            section += (digit or 1) * _CN_UNITS[ch]
            digit = 0.0
    return total + section + digit


@dataclass(frozen=True)
class Values:
    """What a fact states besides its words (see the module)."""

    numbers: tuple[float, ...]
    """Its numbers, in the order it states them ("会话0第1句" is not "会话1第0句")."""
    marks: frozenset[str]
    """Its weekdays, months, relative days, periods, units, class members and negation."""


def _dates(text: str, marks: set[str]) -> str:
    """Relative days, weekdays and months written in Chinese; the text without them (their
    numerals are no numbers)."""
    for word, when in _RELATIVE.items():
        if not word.isascii() and word in text:
            marks.add(f"when:{when}")
            text = text.replace(word, " ")
    for match in re.finditer(r"(?:周|星期|礼拜)([一二三四五六日天末])", text):
        marks.add(f"day:{_WEEKDAYS[match.group(1)]}")
    text = re.sub(r"(?:周|星期|礼拜)[一二三四五六日天末]", " ", text)
    for match in re.finditer(r"([一二三四五六七八九十]+|\d+)月", text):
        numeral = match.group(1)
        marks.add(f"month:{int(numeral) if numeral.isdigit() else int(_chinese_number(numeral))}")
    return re.sub(r"(?:[一二三四五六七八九十]+|\d+)月(?:份)?", " ", text)


def _numbers(text: str) -> list[float]:
    """The numbers of a text in order: Arabic (ordinals too), Chinese where they count
    something or are ordinals (an article "一只" is none), English words, "半"."""
    found: list[float] = []
    for match in _NUMBER_TOKEN.finditer(text):
        token = match.group()
        if token == "半":
            found.append(0.5)
        elif token[0].isascii() and token[0].isalpha():
            if token in _EN_NUMBERS:
                found.append(float(_EN_NUMBERS[token]))
        elif digits := _DIGITS.match(token.removeprefix("第")):
            found.append(float(digits.group()))
        else:
            numeral, rest = token.removeprefix("第"), text[match.end() :]
            if numeral == "一" and _ARTICLE.match(rest):
                continue  # 一只猫: "a cat", no count
            if token.startswith("第") or len(numeral) > 1 or _COUNTED.match(rest):
                found.append(_chinese_number(numeral))
    return found


def _marks(text: str, marks: set[str]) -> None:
    """Periods, units, class members and negation (both scripts); English days, months and
    relative days."""
    rest = text
    for table, kind in ((_PERIODS, "per"), (_UNITS, "unit")):
        for word, value in sorted(table.items(), key=lambda item: -len(item[0])):
            if not word.isascii() and word in rest:
                marks.add(f"{kind}:{value}")
                rest = rest.replace(word, " ")
    marks.update(
        f"{name}:{word}" for word, name in _CLASS_OF.items() if not word.isascii() and word in rest
    )
    negated = any(word in rest for word in _NEGATIONS_CN)
    for word in _WORD.findall(text):
        bare = word.removesuffix("s") if word.endswith("s") and len(word) > 3 else word
        if bare in _EN_DAYS:
            marks.add(f"day:{_EN_DAYS[bare]}")
        elif word in _EN_MONTHS:
            marks.add(f"month:{_EN_MONTHS.index(word) + 1}")
        elif word in _RELATIVE:
            marks.add(f"when:{_RELATIVE[word]}")
        elif word in ("last", "next", "this"):
            marks.add(f"when:{word}")
        for table, kind in ((_PERIODS, "per"), (_UNITS, "unit")):
            if bare in table:
                marks.add(f"{kind}:{table[bare]}")
        member = word if word in _CLASS_OF else bare
        if member in _CLASS_OF:
            marks.add(f"{_CLASS_OF[member]}:{member}")
        negated = negated or word in _NEGATIONS_EN or word.endswith("n't")
    if negated:
        marks.add("negated")


@functools.lru_cache(maxsize=8_192)
def values(text: str) -> Values:
    """The values `text` states (see the module); cached: a new fact is compared with each of
    its near neighbours, and the same neighbours come back write after write."""
    marks: set[str] = set()
    rest = _dates(text.casefold(), marks)
    numbers = tuple(_numbers(rest))
    _marks(rest, marks)
    return Values(numbers, frozenset(marks))
