import math

import pytest

from tokenfactory.validation import ConfigError, check_choice, check_int, check_number, reject_unknown_keys


@pytest.mark.parametrize("value,kw,ok", [
    (1.0, {"low": 0}, True),
    (0.0, {"low": 0, "low_inclusive": False}, False),
    (math.nan, {}, False),
    ("3", {}, False),
    (True, {}, False),
    (5, {"high": 4}, False),
])
def test_check_number(value, kw, ok):
    if ok:
        assert check_number("f", value, **kw) == value
    else:
        with pytest.raises(ConfigError, match="^f: "):
            check_number("f", value, **kw)


def test_range_in_message():
    with pytest.raises(ConfigError, match=r"outside the allowed range \[1, 8\]"):
        check_int("x", 9, low=1, high=8)
    with pytest.raises(ConfigError, match="integer"):
        check_int("x", 1.5)
    with pytest.raises(ConfigError, match="'a'"):
        check_choice("x", "c", ["a", "b"])
    with pytest.raises(ConfigError, match="sec.zz: unknown key"):
        reject_unknown_keys("sec", {"zz": 1}, {"a"})


def test_check_int_rejects_nan_and_inf_with_the_field_name():
    import math

    import pytest

    from tokenfactory.validation import ConfigError, check_int

    for bad in (math.nan, math.inf, -math.inf):
        with pytest.raises(ConfigError, match="pool.replicas: expected an integer"):
            check_int("pool.replicas", bad)
