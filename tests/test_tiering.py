"""The tiering trial's verdict and the run summary's compiler row, on recorded step times."""

import pytest

from executor.report_text import compiler_line, summary_lines
from executor.wafer.program import TIER_UP_MIN_GAIN, choose_compiler


def test_the_faster_median_wins_even_when_one_step_of_it_was_slow():
    fx = [0.0040, 0.0041, 0.0042, 0.0043, 0.0044]
    inductor = [0.0030, 0.0031, 0.0500, 0.0032, 0.0033]  # one stall: the mean would pick fx
    verdict = choose_compiler(fx, inductor)
    assert verdict == {"chosen": "inductor", "fx_median_s": 0.0042, "inductor_median_s": 0.0032,
                       "steps_each": 5}


def test_a_clearly_slower_inductor_is_not_chosen():
    verdict = choose_compiler([0.002, 0.002, 0.002, 0.002], [0.003, 0.003, 0.001, 0.003])
    assert verdict["chosen"] == "fx"
    assert verdict["fx_median_s"] == 0.002 and verdict["inductor_median_s"] == 0.003


def test_an_even_count_takes_the_mean_of_the_middle_two():
    verdict = choose_compiler([1.0, 2.0, 4.0, 100.0], [0.5, 1.0, 2.0, 3.0])
    assert verdict["fx_median_s"] == 3.0 and verdict["inductor_median_s"] == 1.5


def test_fx_is_kept_only_when_it_is_faster_by_the_margin():
    inductor = [0.010] * 3
    fx_just_under = 0.010 * (1 - TIER_UP_MIN_GAIN) * 1.01  # fx faster, but within the margin
    fx_just_over = 0.010 * (1 - TIER_UP_MIN_GAIN) * 0.99
    assert choose_compiler([fx_just_under] * 3, inductor)["chosen"] == "inductor"
    assert choose_compiler([fx_just_over] * 3, inductor)["chosen"] == "fx"
    assert choose_compiler(inductor, inductor)["chosen"] == "inductor"  # a tie goes to inductor
    assert choose_compiler([0.0099] * 3, inductor, min_gain=0.0)["chosen"] == "fx"


@pytest.mark.parametrize("fx, inductor", [([0.1, 0.1], [0.1]), ([], [])])
def test_unequal_or_empty_trials_are_refused(fx, inductor):
    with pytest.raises(ValueError, match=f"fx was timed on {len(fx)}, inductor on "
                                         f"{len(inductor)}"):
        choose_compiler(fx, inductor)


def _report(**tier):
    return {"compiler": "auto", "active": "fx", "cache_hit": False, "tier_up": tier}


def test_the_summary_says_what_each_candidate_measured():
    trial = choose_compiler([0.0041] * 20, [0.0032] * 20)
    line = compiler_line({**_report(trial=trial), "active": "inductor"})
    assert line == ("inductor chosen by trial (fx 4.1 ms, inductor 3.2 ms a step, median of "
                    "20 steps each)")
    kept = compiler_line(_report(trial=choose_compiler([0.0041] * 20, [0.0045] * 20)))
    assert kept == "fx kept by trial (fx 4.1 ms, inductor 4.5 ms a step, median of 20 steps each)"
    rows = dict(summary_lines({"compile": {**_report(trial=trial), "active": "inductor"}}))
    assert rows["compiler"] == line


def test_the_summary_says_why_no_trial_ran():
    assert compiler_line(_report(skipped="the fx steps left take ~2.0 s, under 30 s")) == \
        "fx: no inductor compile: the fx steps left take ~2.0 s, under 30 s"
    assert compiler_line(_report(checked_at_step=3, agreed=False, max_abs_diff=0.5)) == \
        "fx: inductor's outputs differed from fx's at step 3 (max abs diff 0.5)"
    assert compiler_line(_report(error="RuntimeError: the inductor compile failed\nlog")) == \
        "fx: inductor failed: RuntimeError: the inductor compile failed"
    assert compiler_line(_report(compiled_in_background=True)) == \
        "fx (inductor not ready before the run ended)"
    assert compiler_line({"compiler": "inductor", "active": "inductor", "cache_hit": True}) == \
        "inductor (from the compile cache)"
    assert compiler_line({"compiler": "fx", "active": "fx", "cache_hit": False}) == "fx"
    assert compiler_line(None) is None and "compiler" not in dict(summary_lines({}))
