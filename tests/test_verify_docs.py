"""``python -m nvflare_moon.benchmark verify-docs``: the repository's docs pass; a figure edited by hand and an
untagged result figure fail, naming them; the expression language against hand computations."""

import contextlib
import dataclasses
import io
import math
import shutil
import subprocess
import sys

import numpy as np
import pytest

from nvflare_moon.benchmark import verify_docs
from nvflare_moon.benchmark.verify_docs import ExpressionError, evaluate, matches, verify

from .conftest import REPO


def record(*accuracies, **extra):
    """A run record with one round per accuracy (fractions, as the benchmark records them)."""
    rounds = [{"round": i, "test_accuracy": a, "round_seconds": 10.0 + i} for i, a in enumerate(accuracies)]
    return {"rounds": rounds, "final_accuracy": accuracies[-1], **extra}


def run_main(argv):
    output = io.StringIO()
    with contextlib.redirect_stdout(output):
        code = verify_docs.main(argv)
    return code, output.getvalue()


@pytest.fixture
def docs_copy(tmp_path):
    """The pages and the records, copied (without the images) into a folder of their own."""
    shutil.copy(REPO / "README.md", tmp_path / "README.md")
    shutil.copytree(REPO / "docs", tmp_path / "docs", ignore=shutil.ignore_patterns("*.png"))
    return tmp_path


def edit(path, old, new):
    text = path.read_text(encoding="utf-8")
    assert text.count(old) == 1, old
    path.write_text(text.replace(old, new), encoding="utf-8")
    return text[: text.index(old)].count("\n") + 1  # the line of the edit


# ---- the repository -----------------------------------------------------------------------------------------------


def test_the_repositorys_figures_all_match_their_records():
    report = verify(str(REPO))
    assert report.problems == []
    assert report.count("record") > 100 and report.count("published") > 0
    # the README's headline claims are checked, not only present
    checked = {(f.page, f.shown) for f in report.figures if f.kind == "record"}
    headline = {"66.63 ± 1.77%", "68.11 ± 1.05%", "+1.48 ± 0.76", "35", "2.86×"}
    assert {("README.md", figure) for figure in headline} <= checked
    assert {("docs/results.md", "67.26%"), ("docs/results.md", "+1.18")} <= checked
    # and so are the figures of the contributor notebook's run log
    assert {("docs/notebook.md", "66.56%"), ("docs/notebook.md", "70.41%")} <= checked


def test_the_subcommand_passes_on_the_repository_and_leaves_the_benchmarks_options_alone():
    result = subprocess.run(
        [sys.executable, "-m", "nvflare_moon.benchmark", "verify-docs"], cwd=REPO, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no problem" in result.stdout


def test_a_figure_edited_by_hand_fails_naming_its_file_line_and_both_values(docs_copy):
    expression = "mean_std(final(moon) - final(fedavg), final(moon1) - final(fedavg1), final(moon2) - final(fedavg2))"
    line = edit(
        docs_copy / "README.md",
        f"+1.48 ± 0.76<!-- record: {expression} -->",
        f"+1.84 ± 0.76<!-- record: {expression} -->",
    )
    code, output = run_main(["--root", str(docs_copy)])
    assert code == 1
    assert f"README.md:{line}: printed +1.84 ± 0.76, recomputed 1.48 ± 0.76" in output
    assert output.count("printed ") == 1


def test_an_edited_std_fails_too(docs_copy):
    # the sample std (ddof=1) of FedAvg's three seeds instead of the population std the project uses
    edit(
        docs_copy / "docs" / "practical_options.md",
        "57.50 ± 1.09<!-- record: mean_std(final(qf0), final(qf1), final(qf2)) --> |",
        "57.50 ± 1.33<!-- record: mean_std(final(qf0), final(qf1), final(qf2)) --> |",
    )
    code, output = run_main(["--root", str(docs_copy)])
    assert code == 1 and "printed 57.50 ± 1.33, recomputed 57.50 ± 1.09" in output


def test_an_untagged_result_figure_fails_naming_it(docs_copy):
    page = docs_copy / "docs" / "results.md"
    line = page.read_text(encoding="utf-8").count("\n") + 2
    page.write_text(page.read_text(encoding="utf-8") + "\nMOON gains 12.34% here, 1.5× faster.\n", encoding="utf-8")
    code, output = run_main(["--root", str(docs_copy)])
    assert code == 1
    assert f"docs/results.md:{line}: untagged result figure (a percentage with two decimals) '12.34%'" in output
    assert f"docs/results.md:{line}: untagged result figure (a speed-up) '1.5×'" in output


def test_an_untagged_result_figure_fails_on_any_page_not_only_the_results(docs_copy):
    page = docs_copy / "docs" / "algorithms.md"
    line = page.read_text(encoding="utf-8").count("\n") + 2
    page.write_text(page.read_text(encoding="utf-8") + "\nA 12.34% gain, ± 0.50, 1.5× faster.\n", encoding="utf-8")
    code, output = run_main(["--root", str(docs_copy)])
    assert code == 1 and "looked for on every page" in output
    for what, figure in (
        ("a percentage with two decimals", "12.34%"),
        ("a ± figure", "± 0.50"),
        ("a speed-up", "1.5×"),
    ):
        assert f"docs/algorithms.md:{line}: untagged result figure ({what}) '{figure}'" in output


def test_a_derived_figure_is_recomputed_from_its_numbers_alone(docs_copy):
    page = docs_copy / "docs" / "algorithms.md"
    line = page.read_text(encoding="utf-8").count("\n") + 2
    text = "\nA step costs 7/3 ≈ 2.3×<!-- derived: 7 / 3 --> and 5/3 ≈ 1.76×<!-- derived: 5 / 3 -->.\n"
    page.write_text(page.read_text(encoding="utf-8") + text, encoding="utf-8")
    code, output = run_main(["--root", str(docs_copy)])
    assert code == 1 and output.count("printed ") == 1
    derived = [
        f.shown for f in verify(str(docs_copy)).figures if f.page == "docs/algorithms.md" and f.kind == "derived"
    ]
    assert derived == ["2.3×", "1.76×"]
    assert f"docs/algorithms.md:{line}: printed 1.76×, recomputed 1.67 (1.66667) from `5 / 3`" in output


def test_a_derived_figure_reads_no_record():
    figure = verify_docs.Figure("p.md", 1, "67.26", "67.26%", "derived", "final(moon)", 0, 0)
    problem = verify_docs.check_figure(figure, {"moon": record(0.6726)})
    assert "unknown name 'moon'" in problem and "numbers alone" in problem
    as_record = dataclasses.replace(figure, kind="record")
    assert verify_docs.check_figure(as_record, {"moon": record(0.6726)}) is None


def test_a_missing_record_fails_naming_it(docs_copy):
    (docs_copy / "docs" / "results" / "paper" / "runs" / "moon-beta0.5-seed0.json").unlink()
    code, output = run_main(["--root", str(docs_copy)])
    assert code == 1
    assert "README.md: no such record: docs/results/paper/runs/moon-beta0.5-seed0.json" in output
    assert "'moon' could not be read" in output


def test_a_folder_without_readme_is_refused(tmp_path):
    with contextlib.redirect_stderr(io.StringIO()) as errors:
        assert verify_docs.main(["--root", str(tmp_path)]) == 2
    assert "no README.md" in errors.getvalue()


# ---- what counts as a figure --------------------------------------------------------------------------------------


def figures_and_untagged(text, page="docs/results.md"):
    text = verify_docs.blanked(verify_docs.without_fenced_code(text), verify_docs.CODE_SPAN)
    figures, problems = verify_docs.tagged_figures(text, page)
    return figures, problems + verify_docs.untagged_figures(text, figures, page)


def test_a_tag_takes_the_figure_before_it_with_its_unit_and_emphasis():
    figures, problems = figures_and_untagged(
        "| **57.50 ± 1.09**<!-- record: a --> | 27<!-- record: b --> rounds, 3.7×<!-- published --> "
        "(−0.55<!-- record: c -->), 10,145<!-- record: d --> img/s, 135<!-- record: e --> s, 12.5%<!-- unrecorded: x -->"
    )
    assert problems == []
    assert [(f.printed, f.shown, f.kind) for f in figures] == [
        ("57.50 ± 1.09", "57.50 ± 1.09**", "record"),
        ("27", "27", "record"),
        ("3.7", "3.7×", "published"),
        ("−0.55", "−0.55", "record"),
        ("10,145", "10,145", "record"),
        ("135", "135", "record"),
        ("12.5", "12.5%", "unrecorded"),
    ]


def test_a_tag_after_no_figure_or_without_its_reason_is_a_problem():
    _, problems = figures_and_untagged("in 27 rounds<!-- record: x -->; 43.62%<!-- unrecorded -->")
    assert len(problems) == 3
    assert "a record tag follows no figure" in problems[0]
    assert "the unrecorded tag of 43.62 says nothing" in problems[1]
    assert "untagged result figure (a percentage with two decimals) '43.62%'" in problems[2]  # so it stays untagged


def test_hyperparameters_code_and_comments_are_not_result_figures():
    text = (
        "SGD lr 0.01, β = 0.5, μ = 5, 10 sites × 10 epochs, 79% of the start, 0.6 GB, round 12.\n"
        "`57.50 ± 1.09` and `3.7×` in code, <!-- 12.34% in a comment -->\n"
        "```\n65.43% ± 1 2.69x\n```\n"
    )
    assert figures_and_untagged(text) == ([], [])


def test_each_kind_of_untagged_figure_is_found():
    _, problems = figures_and_untagged("43.60% then 45.43 ± 1.37 then 2.07× and 1.80x")
    assert [p.split("(")[1].split(")")[0] for p in problems] == [
        "a percentage with two decimals",
        "a ± figure",
        "a speed-up",
        "a speed-up",
    ]


def test_a_size_is_not_a_speed_up():
    assert figures_and_untagged("a 5×5 kernel, 3×3 stem, 64×64 inputs and 32×32 input") == ([], [])
    _, problems = figures_and_untagged("32×32 at 2×, 46× the bytes")
    assert [p.split("'")[1] for p in problems] == ["2×", "46×"]


def test_a_lone_plus_minus_figure_is_tagged_after_its_number():
    figures, problems = figures_and_untagged("runs vary by about ±60<!-- unrecorded: three runs --> MB")
    assert problems == []
    assert [(f.printed, f.shown, f.kind) for f in figures] == [("±60", "±60", "unrecorded")]
    assert verify_docs.printed_numbers(figures[0].printed) == ["60"]


# ---- the expression language against hand computations ------------------------------------------------------------


def test_std_is_the_population_std():
    # mean 7/3; deviations -4/3, -1/3, 5/3; squares 16/9 + 1/9 + 25/9 = 42/9; / 3 = 14/9
    assert evaluate("std(1, 2, 4)", {}) == (pytest.approx(math.sqrt(14 / 9)),)
    assert evaluate("std(1, 2, 4)", {})[0] == pytest.approx(1.247219, abs=1e-6)
    assert evaluate("mean(1, 2, 4)", {}) == (pytest.approx(7 / 3),)


def test_mean_std_of_final_accuracies_in_percent():
    names = {"a": record(0.1, 0.5), "b": record(0.2, 0.6), "c": record(0.3, 0.7)}
    mean, std = evaluate("mean_std(final(a), final(b), final(c))", names)
    assert mean == pytest.approx(60.0)
    assert std == pytest.approx(math.sqrt(200 / 3))  # deviations -10, 0, +10 points


def test_curves_rounds_differences_and_ratios():
    names = {"m": record(0.10, 0.30, 0.20, 0.40), "f": record(0.10, 0.20, 0.25, 0.30)}
    assert evaluate("curve(m)[1]", names) == (pytest.approx(30.0),)
    assert evaluate("curve(m)[-1]", names) == evaluate("final(m)", names)
    assert evaluate("mean(curve(m)[1:3])", names) == (pytest.approx(25.0),)  # rounds 1 and 2
    assert evaluate("min(curve(m) - curve(f))", names) == (pytest.approx(-5.0),)  # round 2: 20 - 25
    assert evaluate("count_above(curve(m) - curve(f), 0)", names) == (2.0,)  # rounds 1 and 3
    assert evaluate("first_reach(curve(m), final(f))", names) == (2.0,)  # 30% first in round 1: 2 rounds
    assert evaluate("first_reach(curve(f), final(f))", names) == (4.0,)
    assert evaluate("len(curve(f)) / first_reach(curve(m), final(f))", names) == (2.0,)
    assert evaluate("argmax(curve(m)) + 1", names) == (4.0,)
    assert evaluate("max(curve(f)), median(curve(f))", names) == (pytest.approx(30.0), pytest.approx(22.5))
    assert evaluate("mean_curve(curve(m), curve(f))[1]", names) == (pytest.approx(25.0),)
    assert evaluate("median(round_seconds(m))", names) == (12.0,)  # rounds 1-3: 11, 12, 13 s


def test_the_benchmarks_own_rule_decides_first_reach():
    names = {"a": record(0.6486, 0.6486)}
    assert evaluate("first_reach(curve(a), final(a))", names) == (1.0,)  # reaching is >=, on equal floats
    with pytest.raises(ExpressionError, match="never reaches"):
        evaluate("first_reach(curve(a), 70)", names)


def test_site_figures_and_json_values():
    spread = {"accuracy": {"mean": 0.5, "worst": 0.25, "best": 0.75, "std": 0.125}}
    names = {
        "r": {"rounds": [{"spread": spread}, {"spread": {"accuracy": {"worst": 0.5}}}]},
        "j": {"a": {"b": 7, "l": [4, 6]}},
    }
    assert evaluate('site_accuracy(r, "worst")', names) == (50.0,)
    assert evaluate('site_accuracy(r, "std", 0)', names) == (12.5,)
    assert evaluate('value(j, "a.b") / 2', names) == (3.5,)
    assert evaluate('value(j, "a.l.1")', names) == (6.0,)  # a number part indexes a list
    for missing in ("a.c", "a.l.2", "a.l.x", "a.b.0"):
        with pytest.raises(ExpressionError, match=f"has no '{missing}'"):
            evaluate(f'value(j, "{missing}")', names)


@pytest.mark.parametrize(
    "expression, message",
    [
        ('__import__("os")', "unknown function '__import__'"),
        ("r.rounds", "not part of the expression language"),
        ("[1, 2]", "not part of the expression language"),
        ("2 ** 3", "not part of the expression language"),
        ("(lambda: 1)()", "unknown function"),
        ("mean(x=1)", "by position only"),
        ("final(nothing)", "unknown name 'nothing'"),
        ("final(1)", "takes a record"),
        ("curve(r)", "not a figure"),
        ("curve(r)[0.5]", "not a whole number"),
        ("curve(r)[::2]", "takes no step"),
        ("1 / 0", "ZeroDivisionError"),
        ("curve(r)[9]", "IndexError"),
        ("final(r, r)", "final()"),
        ("mean(curve(r), curve(r))", "one curve or several numbers"),
        ("1, 2, 3", "not a figure"),
        ("1 +", "not an expression"),
    ],
)
def test_anything_outside_the_language_is_refused_with_a_reason(expression, message):
    with pytest.raises(ExpressionError, match=message):
        evaluate(expression, {"r": record(0.1, 0.2)})


def test_let_names_a_value_for_later_tags():
    names = {"a": record(0.1, 0.5), "b": record(0.2, 0.7)}
    text = "<!-- let: target = mean(final(a), final(b)) -->\n<!-- let: broken = final(c) -->\n"
    problems = verify_docs.define_values(text, "page.md", names)
    assert names["target"] == pytest.approx(60.0)
    assert evaluate("target - final(a)", names) == (pytest.approx(10.0),)
    assert len(problems) == 1 and problems[0].startswith("page.md:2: let broken = final(c): unknown name 'c'")


# ---- comparing at the printed precision ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "printed, computed, expected",
    [
        ("67.26", (67.25999999999999,), True),
        ("67.25", (67.25999999999999,), False),
        ("+2.40", (2.4,), True),
        ("2.40", (-2.4,), False),
        ("−0.55", (-0.5500000000000043,), True),
        ("3.7", (100 / 27,), True),
        ("2.07", (56 / 27,), True),
        ("27", (27,), True),
        ("10,145", (10145.2,), True),
        ("0.0", (-0.01,), True),
        ("+1.18", (1.1799999999999926,), True),
        ("57.50 ± 1.09", (57.503, 1.0864), True),
        ("57.50 ± 1.33", (57.503, 1.0864), False),
        ("57.50 ± 1.09", (57.503,), False),
    ],
)
def test_matches_compares_at_the_printed_precision(printed, computed, expected):
    assert matches(printed, computed) is expected


# ---- reading the records ------------------------------------------------------------------------------------------


def test_a_run_of_a_per_round_csv_reads_as_a_record(tmp_path):
    path = tmp_path / "accuracy_per_round.csv"
    path.write_text("run,round,test_accuracy\na,0,0.1\nb,0,0.3\na,1,0.25\n")
    read = verify_docs.read_curves_csv(str(path), "a")
    assert read["final_accuracy"] == 0.25 and [r["test_accuracy"] for r in read["rounds"]] == [0.1, 0.25]
    assert np.isnan(read["rounds"][0]["round_seconds"])  # an older CSV without the column
    with pytest.raises(ValueError, match="no rows of run 'c'"):
        verify_docs.read_curves_csv(str(path), "c")
    with pytest.raises(ValueError, match="name the run"):
        verify_docs.read_record(str(tmp_path), "accuracy_per_round.csv")


def test_record_names_are_checked():
    text = "<!-- records: a = x.json,\n  b = y.csv#run -->"
    assert verify_docs.record_names(text, "p.md") == {"a": "x.json", "b": "y.csv#run"}
    with pytest.raises(ValueError, match="p.md:1: the record name 'a' is taken"):
        verify_docs.record_names("<!-- records: a = x.json, a = y.json -->", "p.md")
    with pytest.raises(ValueError, match="is a function"):
        verify_docs.record_names("<!-- records: final = x.json -->", "p.md")
    with pytest.raises(ValueError, match="is not `name = path`"):
        verify_docs.record_names("<!-- records: x.json -->", "p.md")
