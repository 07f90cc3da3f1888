"""The tool-use rule (agentrl.telemetry.tool_use): a warning when reward rises while tool calls fall,
checked on hand-computed windows."""

from __future__ import annotations

import math

import pytest

from agentrl.telemetry.tool_use import ToolUseWatch, call_episode_frac, tool_use_drop, tool_use_metrics


def test_call_episode_frac_is_the_complement_of_the_no_call_share():
    assert call_episode_frac({"tools/no_call_episode_frac": 0.25}) == 0.75
    assert math.isnan(call_episode_frac({"tools/no_call_episode_frac": math.nan}))
    assert math.isnan(call_episode_frac({}))  # a step whose episodes had no model turn
    assert tool_use_metrics({"tools/no_call_episode_frac": 1.0}) == {"tools/call_episode_frac": 0.0}


def test_the_rule_compares_the_window_halves():
    # halves: reward 0.2 -> 0.5 (+0.3), share 0.9 -> 0.3 (-0.6): both past their bounds
    drop = tool_use_drop([4, 5, 6, 7], [0.1, 0.3, 0.4, 0.6], [1.0, 0.8, 0.4, 0.2])
    assert drop is not None
    assert (drop.first, drop.last) == (4, 7)
    assert drop.reward_before == pytest.approx(0.2) and drop.reward_after == pytest.approx(0.5)
    assert drop.share_before == pytest.approx(0.9) and drop.share_after == pytest.approx(0.3)
    assert "fell 0.90 -> 0.30" in drop.message() and "rose 0.200 -> 0.500" in drop.message()


@pytest.mark.parametrize("rewards, shares, why", [
    ([0.1, 0.3, 0.4, 0.6], [1.0, 0.9, 1.0, 0.9], "share steady: the tool still fires"),
    ([0.5, 0.5, 0.5, 0.52], [1.0, 0.8, 0.4, 0.2], "reward +0.01 < 0.05: falling use that is not rewarded"),
    ([0.6, 0.4, 0.3, 0.1], [1.0, 0.8, 0.4, 0.2], "reward falls"),
    ([0.1, 0.3, 0.4, 0.6], [0.3, 0.3, 0.2, 0.21], "share -0.095 < 0.2"),
])
def test_no_warning_unless_both_move(rewards, shares, why):
    assert tool_use_drop([0, 1, 2, 3], rewards, shares) is None, why


def test_the_bounds_are_inclusive_and_settable():
    # reward +0.25 and share -0.5 exactly (binary fractions, no rounding)
    assert tool_use_drop([0, 1], [0.25, 0.5], [1.0, 0.5], min_reward_rise=0.25, min_share_drop=0.5) is not None
    assert tool_use_drop([0, 1], [0.25, 0.5], [1.0, 0.5], min_reward_rise=0.375) is None
    with pytest.raises(ValueError, match="even number"):
        tool_use_drop([0, 1, 2], [0.0] * 3, [0.0] * 3)


def test_watch_warns_once_per_window_and_skips_steps_without_a_share():
    watch = ToolUseWatch(window=4)
    # steps 0-3: reward 0.2 -> 0.5, share 0.95 -> 0.55: warns at step 3
    seq = [(0.1, 1.0), (0.3, 0.9), (0.4, 0.6), (0.6, 0.5)]
    said = [watch.observe(i, r, s) for i, (r, s) in enumerate(seq)]
    assert said[:3] == [None, None, None] and said[3] is not None and "steps 0-3" in said[3]
    # the trend goes on and the rule holds on every later window (steps 1-4: share 0.75 -> 0.4, ...):
    # quiet for the next 3 steps (4, 5, 6), then a warning on steps 4-7 (reward +0.175, share 0.25 -> 0)
    more = [(0.7, 0.3), (0.8, 0.2), (0.9, 0.0), (0.95, 0.0)]
    said = [watch.observe(4 + i, r, s) for i, (r, s) in enumerate(more)]
    assert said[:3] == [None, None, None] and said[3] is not None and "steps 4-7" in said[3]
    assert watch.summary() == {"warned_at_steps": [3, 7]}
    # a step with no share to count (NaN) breaks the window: 4 counted steps in a row are needed again
    fresh = ToolUseWatch(window=4)
    for i, (r, s) in enumerate([(0.1, 1.0), (0.3, 0.8), (0.4, math.nan), (0.4, 0.4), (0.6, 0.2)]):
        assert fresh.observe(i, r, s) is None
    assert fresh.warned_at == []


def test_an_env_without_tools_never_warns():
    watch = ToolUseWatch(window=2)
    assert all(watch.observe(i, i / 10, math.nan) is None for i in range(10))
    with pytest.raises(ValueError, match="window"):
        ToolUseWatch(window=3)
