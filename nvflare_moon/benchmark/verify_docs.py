"""``python -m nvflare_moon.benchmark verify-docs``: every result figure of the docs recomputed from the committed
record it names, and no result figure left without a tag.

A figure is tagged by an HTML comment right after it (after its unit, ``%``, ``×``, ``x``, `` s`` or `` points``,
and a closing ``**``), which Markdown does not show::

    67.26%<!-- record: final(moon) -->               recomputed from a record, compared at the printed precision
    57.50 ± 1.09<!-- record: mean_std(...) -->       a ± figure: the expression gives the mean and the std
    69.1%<!-- published: MOON paper, Table 1 -->     a published number, quoted, not ours
    43.62%<!-- unrecorded: why -->                   from a run whose record is not committed: not verified
    2.3×<!-- derived: 7 / 3 -->                      arithmetic, not a measurement: numbers only, compared the same way
    about ±60<!-- unrecorded: why --> MB             a lone ± figure (a spread) is tagged the same way

``<!-- records: moon = docs/results/paper/runs/moon-beta0.5-seed0.json, q0 = ...csv#fedavg-beta0.5-seed0 -->`` names
the records a page's expressions read (paths from the repository's root): a run record (``<out>/runs/<run_id>.json``),
one run's rows of a per-round CSV (``accuracy_per_round.csv#<run_id>``), or any other JSON file (read with
``value``). ``<!-- let: target = mean(final(q0), final(q1)) -->`` names a value for the page's tags (a ``let`` may
use the ones above it). A ``derived`` expression reads no record and no ``let``: it is arithmetic on numbers alone
(a cost counted from the passes of a step, a share of a count), checked so that the printed figure stays its result.

An expression is a tiny language in Python's syntax, parsed with :mod:`ast` and never run as Python: numbers,
strings, the page's record names, ``+ - * /``, ``c[i]`` and ``c[a:b]`` on a curve, a pair ``a, b`` (for a ``±``
figure) and calls of :data:`FUNCTIONS`. Accuracies are in percent, as the docs print them.

On every page checked (README.md and docs/*.md), outside fenced code, inline code and HTML comments, an untagged
result figure fails the check: a percentage with two decimals (``43.60%``), a ``±`` before a number, or a number
directly followed by ``×`` or ``x`` (``3.7×``; not a size such as ``5×5`` or ``32×32``). Hyperparameters
(``lr 0.01``, ``β = 0.5``, ``μ = 5``) are none of these. The protocols' ``docs/results/<protocol>/summary.md`` are
not read: the benchmark writes them from the records.
"""

import argparse
import ast
import csv
import glob
import json
import operator
import os
import re
import sys
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from . import tables

NUMBER = r"(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?"
SIGNED = rf"[+\-−]?{NUMBER}"
TAG = re.compile(r"<!--\s*(record|derived|published|unrecorded)\b\s*(?::(.*?))?-->", re.DOTALL)
RECORDS = re.compile(r"<!--\s*records:(.*?)-->", re.DOTALL)
LET = re.compile(r"<!--\s*let:\s*(\w+)\s*=(.*?)-->", re.DOTALL)
FIGURE_BEFORE_TAG = re.compile(
    rf"(?<![\w.,])(?P<figure>(?:±\s*)?{SIGNED}(?:\s*±\s*{NUMBER})?)(?:\s?(?:%|×|x|s|points?))?\**\s*$"
)
UNTAGGED = (
    ("a percentage with two decimals", re.compile(r"(?<![\w.])\d+\.\d{2}\s?%")),
    ("a ± figure", re.compile(rf"±\s*(?:about\s+)?[+\-−]?{NUMBER}%?")),
    ("a speed-up", re.compile(rf"(?<![\w.,]){NUMBER}(?:×(?!\d)|x\b)")),  # 5×5 is a size
)
FENCE = re.compile(r"^ {0,3}(```|~~~)")
CODE_SPAN = re.compile(r"`[^`\n]*`")
COMMENT = re.compile(r"<!--.*?-->", re.DOTALL)


class ExpressionError(ValueError):
    """An expression that cannot be evaluated; the message says why."""


# ---- the functions of the expression language ----------------------------------------------------------------------


def _kind(given: Any) -> str:
    """What a value is, in a message (a whole record or curve would fill the screen)."""
    if isinstance(given, dict):
        return "a record"
    if isinstance(given, np.ndarray):
        return f"a curve of {len(given)} values"
    return repr(given)


def _record(given: Any, function: str) -> Dict:
    if not isinstance(given, dict):
        raise ExpressionError(f"{function}() takes a record (a name of the page's records line), not {_kind(given)}")
    return given


def _array(given: Any, function: str) -> np.ndarray:
    if not isinstance(given, np.ndarray):
        raise ExpressionError(f"{function}() takes a curve (e.g. curve(run) or curve(run)[10:50]), not {_kind(given)}")
    return given


def _values(args: Sequence[Any], function: str) -> np.ndarray:
    """The numbers ``function`` reduces: one curve, or several numbers."""
    if len(args) == 1 and isinstance(args[0], np.ndarray):
        values = args[0]
    elif args and all(_is_number(a) for a in args):
        values = np.asarray(args, dtype=np.float64)
    else:
        raise ExpressionError(
            f"{function}() takes one curve or several numbers, not ({', '.join(_kind(a) for a in args)})"
        )
    if not len(values):
        raise ExpressionError(f"{function}() of no values")
    return values


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)


def final(record: Dict) -> float:
    """The run's final top-1 accuracy (%): the record's ``final_accuracy``."""
    return 100 * _record(record, "final")["final_accuracy"]


def curve(record: Dict) -> np.ndarray:
    """The global model's test accuracy (%) in every round, round 0 first."""
    return 100 * np.asarray(tables.curve(_record(record, "curve")), dtype=np.float64)


def site_accuracy(record: Dict, statistic: str, round_index: int = -1) -> float:
    """The global model's accuracy (%) on the sites' own test data in a round (by default the last):
    ``"mean"`` (weighted by training samples), ``"worst"``, ``"best"`` or ``"std"`` (across sites)."""
    rounds = _record(record, "site_accuracy")["rounds"]
    return 100 * rounds[round_index]["spread"]["accuracy"][statistic]


def round_seconds(record: Dict) -> np.ndarray:
    """The wall seconds of every round after round 0 whose time is known, as the summary's s/round counts them
    (round 0 includes the start-up; a continued run does not know the first round of an earlier sitting)."""
    seconds = [r["round_seconds"] for r in _record(record, "round_seconds")["rounds"][1:]]
    return np.asarray([s for s in seconds if not np.isnan(s)], dtype=np.float64)


def value(document: Dict, key: str) -> float:
    """A number of any JSON record by its dotted key, as stored: ``value(gpu, "images_per_second.moon")``; a number
    part indexes a list (``"images_per_second_per_repeat.moon.0"``, the first repeat)."""
    found: Any = _record(document, "value")
    for part in key.split("."):
        if isinstance(found, list) and part.isdigit() and int(part) < len(found):
            found = found[int(part)]
        elif isinstance(found, dict) and part in found:
            found = found[part]
        else:
            raise ExpressionError(f"value(): the record has no {key!r}")
    if not _is_number(found):
        raise ExpressionError(f"value(): {key!r} is {found!r}, not a number")
    return float(found)


def mean(*values: Any) -> float:
    """The mean of one curve or of several numbers."""
    return tables.mean_std(_values(values, "mean"))[0]


def std(*values: Any) -> float:
    """The population standard deviation (``ddof=0``, the project's convention) of one curve or several numbers."""
    return tables.mean_std(_values(values, "std"))[1]


def mean_std(*values: Any) -> Tuple[float, float]:
    """Mean and population standard deviation together, for a ``mean ± std`` figure."""
    return tables.mean_std(_values(values, "mean_std"))


def mean_curve(*curves: Any) -> np.ndarray:
    """The round-by-round mean of several curves of the same length (e.g. the seeds of one method)."""
    return np.asarray(tables.mean_curve([_array(c, "mean_curve") for c in curves]), dtype=np.float64)


def first_reach(accuracies: np.ndarray, target: float) -> int:
    """The rounds a curve needs to reach ``target`` (the round index + 1), as the benchmark's Table 2 counts them."""
    rounds = tables.rounds_to_target(list(_array(accuracies, "first_reach")), target)
    if rounds is None:
        raise ExpressionError(f"first_reach(): the curve never reaches {target}")
    return rounds


def count_above(accuracies: np.ndarray, threshold: float) -> int:
    """How many values of a curve are above ``threshold``."""
    return int(np.sum(_array(accuracies, "count_above") > threshold))


def minimum(*values: Any) -> float:
    """The smallest of one curve or of several numbers."""
    return float(np.min(_values(values, "min")))


def maximum(*values: Any) -> float:
    """The largest of one curve or of several numbers."""
    return float(np.max(_values(values, "max")))


def median(*values: Any) -> float:
    """The median of one curve or of several numbers."""
    return float(np.median(_values(values, "median")))


def argmax(accuracies: np.ndarray) -> int:
    """The index of a curve's largest value, the first if it repeats (the round, counted from 0, of a whole curve)."""
    return int(np.argmax(_array(accuracies, "argmax")))


def length(accuracies: np.ndarray) -> int:
    """How many values a curve has (a run's rounds)."""
    return len(_array(accuracies, "len"))


FUNCTIONS = {
    "final": final,
    "curve": curve,
    "site_accuracy": site_accuracy,
    "round_seconds": round_seconds,
    "value": value,
    "mean": mean,
    "std": std,
    "mean_std": mean_std,
    "mean_curve": mean_curve,
    "first_reach": first_reach,
    "count_above": count_above,
    "min": minimum,
    "max": maximum,
    "median": median,
    "argmax": argmax,
    "len": length,
}
OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


# ---- evaluation ---------------------------------------------------------------------------------------------------


def evaluate(expression: str, names: Mapping[str, Any]) -> Tuple[float, ...]:
    """The figure ``expression`` gives: one number, or two (a pair, or ``mean_std``) for a ``±`` figure.
    ``names``: the page's record names and ``let`` values (each may hold the error that reading it raised)."""
    return _as_figure(value_of(expression, names))


def value_of(expression: str, names: Mapping[str, Any]) -> Any:
    """What ``expression`` evaluates to (a number, a curve, a record, a pair); ExpressionError says why not."""
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as e:
        raise ExpressionError(f"not an expression: {e.msg}") from None
    try:
        with np.errstate(all="raise"):
            return _evaluate(tree.body, names)
    except ExpressionError:
        raise
    except (ArithmeticError, FloatingPointError, IndexError, KeyError, TypeError, ValueError) as e:
        raise ExpressionError(f"{type(e).__name__}: {e}") from None


def _as_figure(result: Any) -> Tuple[float, ...]:
    parts = result if isinstance(result, tuple) else (result,)
    if len(parts) > 2 or not all(_is_number(p) for p in parts):
        raise ExpressionError(
            f"gives ({', '.join(_kind(p) for p in parts)}), not a figure: reduce a curve with mean(), min(), ... "
            "or take a round with [i]"
        )
    return tuple(float(p) for p in parts)


def _evaluate(node: ast.AST, names: Mapping[str, Any]) -> Any:
    if (
        isinstance(node, ast.Constant)
        and isinstance(node.value, (int, float, str))
        and not isinstance(node.value, bool)
    ):
        return node.value
    if isinstance(node, ast.Name):
        return _name(node.id, names)
    if isinstance(node, ast.BinOp) and type(node.op) in OPERATORS:
        left, right = _operand(node.left, names), _operand(node.right, names)
        if isinstance(left, np.ndarray) and isinstance(right, np.ndarray) and len(left) != len(right):
            raise ExpressionError(f"curves of {len(left)} and {len(right)} values in {ast.unparse(node)!r}")
        return OPERATORS[type(node.op)](left, right)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        operand = _operand(node.operand, names)
        return -operand if isinstance(node.op, ast.USub) else operand
    if isinstance(node, ast.Call):
        return _call(node, names)
    if isinstance(node, ast.Subscript):
        return _subscript(node, names)
    if isinstance(node, ast.Tuple):
        return tuple(_evaluate(e, names) for e in node.elts)
    raise ExpressionError(f"{ast.unparse(node)!r} is not part of the expression language")


def _name(name: str, names: Mapping[str, Any]) -> Any:
    if name not in names:
        known = ", ".join(sorted(names)) or "none"
        raise ExpressionError(f"unknown name {name!r}: the page's records and let lines name {known}")
    if isinstance(names[name], Exception):
        raise ExpressionError(f"{name!r} could not be read: {names[name]}")
    return names[name]


def _operand(node: ast.AST, names: Mapping[str, Any]) -> Any:
    operand = _evaluate(node, names)
    if not (_is_number(operand) or isinstance(operand, np.ndarray)):
        raise ExpressionError(f"{ast.unparse(node)!r} is not a number or a curve")
    return operand


def _call(node: ast.Call, names: Mapping[str, Any]) -> Any:
    name = node.func.id if isinstance(node.func, ast.Name) else ast.unparse(node.func)
    if name not in FUNCTIONS:
        raise ExpressionError(f"unknown function {name!r}; the functions are {', '.join(FUNCTIONS)}")
    if node.keywords:
        raise ExpressionError(f"{name}() takes its arguments by position only")
    args = [_evaluate(a, names) for a in node.args]
    if any(isinstance(a, tuple) for a in args):
        raise ExpressionError(f"{name}(): a pair is a whole figure, not an argument")
    try:
        return FUNCTIONS[name](*args)
    except TypeError as e:  # the wrong number of arguments
        raise ExpressionError(f"{name}(): {e}") from None


def _subscript(node: ast.Subscript, names: Mapping[str, Any]) -> Any:
    values = _array(_evaluate(node.value, names), "[]")
    if isinstance(node.slice, ast.Slice):
        if node.slice.step is not None:
            raise ExpressionError(f"{ast.unparse(node)!r}: a slice takes no step")
        bounds = [None if b is None else _integer(b, names) for b in (node.slice.lower, node.slice.upper)]
        return values[bounds[0] : bounds[1]]
    return float(values[_integer(node.slice, names)])


def _integer(node: ast.AST, names: Mapping[str, Any]) -> int:
    index = _evaluate(node, names)
    if not isinstance(index, (int, np.integer)) or isinstance(index, bool):
        raise ExpressionError(f"{ast.unparse(node)!r} is not a whole number (an index)")
    return int(index)


# ---- comparing with what is printed -------------------------------------------------------------------------------


def printed_numbers(printed: str) -> List[str]:
    """The numbers of a printed figure: one, or the mean and the std of ``57.50 ± 1.09``."""
    return re.findall(SIGNED, printed)


def as_printed(computed: float, printed: str) -> str:
    """``computed`` written as ``printed`` is: its number of decimals, ``-`` for a minus, no ``+``, no thousands
    separator and no minus on a zero."""
    decimals = len(printed.split(".")[1]) if "." in printed else 0
    text = f"{computed:.{decimals}f}"
    return text.lstrip("-") if float(text) == 0 else text


def normalised(printed: str) -> str:
    """A printed number in :func:`as_printed`'s form."""
    text = printed.replace("−", "-").replace(",", "").lstrip("+")
    return text.lstrip("-") if float(text) == 0 else text


def matches(printed: str, computed: Sequence[float]) -> bool:
    """Whether the printed figure is the computed one at the printed precision."""
    numbers = printed_numbers(printed)
    return len(numbers) == len(computed) and all(normalised(p) == as_printed(c, p) for p, c in zip(numbers, computed))


# ---- reading the pages and the records ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Figure:
    """A tagged figure: where it is, as printed, its tag's kind and what follows the kind (an expression, a note)."""

    page: str
    line: int
    printed: str  # the number, or both numbers of a ± figure
    shown: str  # as the page shows it, with its unit
    kind: str
    note: str
    start: int  # the figure's span in the page, from its first digit to its tag
    end: int

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def without_fenced_code(text: str) -> str:
    """``text`` with every fenced code block blanked out, its length and line breaks kept."""
    lines, inside = text.split("\n"), False
    for i, line in enumerate(lines):
        fence = bool(FENCE.match(line))
        if inside or fence:
            lines[i] = " " * len(line)
        if fence:
            inside = not inside
    return "\n".join(lines)


def blanked(text: str, pattern: "re.Pattern[str]") -> str:
    """``text`` with each match of ``pattern`` replaced by spaces (line breaks kept)."""
    return pattern.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)


def line_of(text: str, position: int) -> int:
    return text.count("\n", 0, position) + 1


def record_names(text: str, page: str) -> Dict[str, str]:
    """The page's record names, ``{name: reference}``, from its ``<!-- records: name = path, ... -->`` lines."""
    names: Dict[str, str] = {}
    for match in RECORDS.finditer(text):
        for entry in filter(None, (e.strip() for e in match.group(1).split(","))):
            name, equals, reference = (part.strip() for part in entry.partition("="))
            where = f"{page}:{line_of(text, match.start())}"
            if not equals or not name.isidentifier() or not reference:
                raise ValueError(f"{where}: {entry!r} in a records line is not `name = path`")
            if name in names or name in FUNCTIONS:
                raise ValueError(
                    f"{where}: the record name {name!r} is " + ("taken" if name in names else "a function")
                )
            names[name] = reference
    return names


def read_record(root: str, reference: str) -> Dict:
    """What ``reference`` names, from ``root``: ``path.json`` (a run record or any JSON file), or
    ``path.csv#run_id`` (that run's rows of a per-round CSV)."""
    path, _, run_id = reference.partition("#")
    full = os.path.join(root, path)
    if not os.path.isfile(full):
        raise ValueError(f"no such record: {path}")
    if path.endswith(".csv"):
        if not run_id:
            raise ValueError(f"{reference}: name the run, as in {path}#<run_id>")
        return read_curves_csv(full, run_id)
    if run_id:
        raise ValueError(f"{reference}: only a CSV's reference names a run")
    with open(full) as f:
        return json.load(f)


def read_curves_csv(path: str, run_id: str) -> Dict:
    """One run's rounds from a per-round CSV (``summary.write_curves_csv``'s columns; older files lack
    ``round_seconds``) as a record: its rounds and its final accuracy, the last round's."""
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        if not {"run", "round", "test_accuracy"} <= set(reader.fieldnames or ()):
            raise ValueError(f"{path} is not a per-round CSV: its columns are {reader.fieldnames}")
        rows = [row for row in reader if row["run"] == run_id]
    if not rows:
        raise ValueError(f"{path} has no rows of run {run_id!r}")
    rounds = [
        {
            "round": int(row["round"]),
            "test_accuracy": float(row["test_accuracy"]),
            "round_seconds": float(row.get("round_seconds") or "nan"),
        }
        for row in rows
    ]
    if [r["round"] for r in rounds] != list(range(len(rounds))):
        raise ValueError(f"{path}: the rounds of run {run_id!r} are not 0 … {len(rounds) - 1} in order")
    return {"run_id": run_id, "rounds": rounds, "final_accuracy": rounds[-1]["test_accuracy"]}


def define_values(text: str, page: str, names: Dict[str, Any]) -> List[str]:
    """Add the page's ``<!-- let: name = expression -->`` values to ``names``, in page order; a problem for each that
    cannot be evaluated (its name then holds the error) or that takes a name already given."""
    problems = []
    for match in LET.finditer(text):
        name, expression = match.group(1), match.group(2).strip()
        where = f"{page}:{line_of(text, match.start())}"
        if name in names or name in FUNCTIONS:
            problems.append(f"{where}: let {name}: the name is taken")
            continue
        try:
            names[name] = value_of(expression, names)
        except ExpressionError as e:
            names[name] = e
            problems.append(f"{where}: let {name} = {expression}: {e}")
    return problems


def tagged_figures(text: str, page: str) -> Tuple[List[Figure], List[str]]:
    """The page's tagged figures (``text`` without its code), and a problem for a tag that follows no figure."""
    figures, problems = [], []
    for tag in TAG.finditer(text):
        line_start = text.rfind("\n", 0, tag.start()) + 1
        figure = FIGURE_BEFORE_TAG.search(text, line_start, tag.start())
        line = line_of(text, tag.start())
        if figure is None:
            problems.append(f"{page}:{line}: a {tag.group(1)} tag follows no figure: {text[line_start : tag.end()]!r}")
            continue
        note = (tag.group(2) or "").strip()
        if tag.group(1) != "published" and not note:
            problems.append(
                f"{page}:{line}: the {tag.group(1)} tag of {figure.group('figure')} says nothing after its ':'"
            )
            continue
        start = figure.start("figure")
        shown = text[start : tag.start()].strip()
        figures.append(Figure(page, line, figure.group("figure"), shown, tag.group(1), note, start, tag.start()))
    return figures, problems


def untagged_figures(text: str, figures: Sequence[Figure], page: str) -> List[str]:
    """A problem for every result figure of the page (``text`` without its code) that no tag covers (see the
    module's docstring)."""
    searched = blanked(text, COMMENT)
    found = sorted((m.start(), what, m.group(0)) for what, pattern in UNTAGGED for m in pattern.finditer(searched))
    return [
        f"{page}:{line_of(text, start)}: untagged result figure ({what}) {figure!r}: tag it with its record "
        "(<!-- record: ... -->), <!-- derived: ... -->, <!-- published --> or <!-- unrecorded: why -->"
        for start, what, figure in found
        if not any(f.start <= start < f.end for f in figures)
    ]


def doc_pages(root: str) -> List[str]:
    """The pages checked, relative to ``root``: README.md and docs/*.md."""
    pages = ["README.md"] + sorted(os.path.relpath(p, root) for p in glob.glob(os.path.join(root, "docs", "*.md")))
    return [p for p in pages if os.path.isfile(os.path.join(root, p))]


# ---- the check ----------------------------------------------------------------------------------------------------


@dataclass
class Report:
    figures: List[Figure]
    problems: List[str]

    def count(self, kind: str) -> int:
        return sum(f.kind == kind for f in self.figures)


def check_figure(figure: Figure, names: Mapping[str, Any]) -> Optional[str]:
    """The problem with a record- or derived-tagged figure, or None when its expression gives what is printed (a
    derived expression is given no names: numbers only)."""
    try:
        computed = evaluate(figure.note, {} if figure.kind == "derived" else names)
    except ExpressionError as e:
        numbers_only = " (a derived figure is computed from numbers alone)" if figure.kind == "derived" else ""
        return f"{figure.where}: {figure.shown}: `{figure.note}`: {e}{numbers_only}"
    if matches(figure.printed, computed):
        return None
    shown = printed_numbers(figure.printed)
    recomputed = " ± ".join(as_printed(c, shown[min(i, len(shown) - 1)]) for i, c in enumerate(computed))
    exact = ", ".join(f"{c:.6g}" for c in computed)
    return f"{figure.where}: printed {figure.shown}, recomputed {recomputed} ({exact}) from `{figure.note}`"


def verify(root: str) -> Report:
    """Check every page of ``root`` (:func:`doc_pages`); raises ValueError if ``root`` holds no README.md."""
    if not os.path.isfile(os.path.join(root, "README.md")):
        raise ValueError(f"{root} is not the repository's root: it has no README.md")
    figures: List[Figure] = []
    problems: List[str] = []
    cache: Dict[str, Any] = {}
    for page in doc_pages(root):
        with open(os.path.join(root, page), encoding="utf-8") as f:
            text = blanked(without_fenced_code(f.read()), CODE_SPAN)  # markup shown as code is not markup
        try:
            names = record_names(text, page)
        except ValueError as e:
            problems.append(str(e))
            continue
        for reference in names.values():
            if reference not in cache:
                try:
                    cache[reference] = read_record(root, reference)
                except (OSError, ValueError) as e:
                    cache[reference] = e
                    problems.append(f"{page}: {e}")
        values = {name: cache[reference] for name, reference in names.items()}
        problems += define_values(text, page, values)
        found, tag_problems = tagged_figures(text, page)
        problems += tag_problems
        problems += filter(None, (check_figure(f, values) for f in found if f.kind in ("record", "derived")))
        problems += untagged_figures(text, found, page)
        figures += found
    return Report(figures, problems)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m nvflare_moon.benchmark verify-docs",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--root", default=".", help="the repository's root (default: the current folder)")
    parser.add_argument("--unrecorded", action="store_true", help="list every figure tagged unrecorded, with why")
    args = parser.parse_args(argv)
    try:
        report = verify(args.root)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for problem in report.problems:
        print(problem)
    if args.unrecorded:
        for figure in report.figures:
            if figure.kind == "unrecorded":
                print(f"{figure.where}: {figure.shown} unrecorded: {figure.note}")
    print(
        f"verify-docs: {report.count('record')} figures recomputed from their records, {report.count('derived')} "
        f"derived from numbers alone, {report.count('published')} published, {report.count('unrecorded')} unrecorded "
        "(not verified; --unrecorded lists them); "
        "untagged result figures looked for on every page; "
        + (f"{len(report.problems)} problem{'s' * (len(report.problems) > 1)}" if report.problems else "no problem")
    )
    return 1 if report.problems else 0
